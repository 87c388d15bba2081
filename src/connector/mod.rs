//! The system under test: a NIXL KV connector worker behaving like vLLM
//! 0.33.0's, for hybrid models with heterogeneous P/D block geometry.
