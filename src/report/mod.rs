//! Presenting results: sweep reports (table, JSON, JUnit), descriptor
//! tables, and the single-case explanation with its SVG byte map.

pub mod descriptor_table;
pub mod explain;
pub mod junit;
pub mod layout_tables;
pub mod sweep_report;
