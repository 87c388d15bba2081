//! The agents one transport hosts, addressed by [`AgentId`] (their position
//! in creation order) and by name.

use super::checks::check_agent_name;
use super::{AgentId, NixlError, NixlResult};

/// What the table needs to know of an agent.
pub(super) trait NamedAgent {
    fn name(&self) -> &str;
}

/// A transport's agents, in creation order.
#[derive(Debug)]
pub(super) struct AgentTable<A> {
    agents: Vec<A>,
}

impl<A> Default for AgentTable<A> {
    fn default() -> Self {
        Self { agents: Vec::new() }
    }
}

impl<A: NamedAgent> AgentTable<A> {
    /// The rules a new agent's name must meet where names are unique.
    pub fn check_new_name(&self, name: &str) -> NixlResult<()> {
        check_agent_name(name)?;
        if self.id_of(name).is_some() {
            return Err(NixlError::InvalidParam(format!(
                "an agent named '{name}' already exists in this transport"
            )));
        }
        Ok(())
    }

    pub fn add(&mut self, agent: A) -> NixlResult<AgentId> {
        let id = u32::try_from(self.agents.len())
            .map_err(|_| NixlError::InvalidParam("too many agents".into()))?;
        self.agents.push(agent);
        Ok(AgentId(id))
    }

    pub fn get(&self, agent: AgentId) -> NixlResult<&A> {
        self.agents
            .get(agent.0 as usize)
            .ok_or_else(|| no_such_agent(agent))
    }

    pub fn get_mut(&mut self, agent: AgentId) -> NixlResult<&mut A> {
        self.agents
            .get_mut(agent.0 as usize)
            .ok_or_else(|| no_such_agent(agent))
    }

    /// The first agent created under `name`.
    pub fn id_of(&self, name: &str) -> Option<AgentId> {
        let at = self.agents.iter().position(|a| a.name() == name)?;
        Some(AgentId(at as u32))
    }

    #[cfg(feature = "nixl")]
    pub fn iter(&self) -> impl Iterator<Item = &A> {
        self.agents.iter()
    }

    #[cfg(feature = "nixl")]
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut A> {
        self.agents.iter_mut()
    }
}

fn no_such_agent(agent: AgentId) -> NixlError {
    NixlError::NotFound(format!("agent {} does not exist", agent.0))
}
