//! The watches' lists: the names a (re)list in progress returned, and which watches have
//! listed once (every one must before anything is allocated).

use std::collections::{HashMap, HashSet};

/// A watch, to track its lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Source {
    Nodes,
    Configs,
    Services,
    Pools,
    Output(usize),
}

impl Source {
    /// The watched resource, as logs and metrics name it.
    pub(super) fn resource(self) -> &'static str {
        match self {
            Source::Nodes => "nodes",
            Source::Configs => "nodeipamconfigs",
            Source::Services => "servicecidrs",
            Source::Pools => "nodeipampools",
            Source::Output(_) => "outputs",
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Lists {
    /// How many watches must list once.
    needed: usize,
    /// Watches whose first list is complete.
    listed: HashSet<Source>,
    /// Names returned by a (re)list in progress.
    relist: HashMap<Source, HashSet<String>>,
    /// The step at which the config list in progress started.
    configs_list_step: u64,
}

impl Lists {
    /// Lists of the nodes and configs, `outputs` outputs, and the ServiceCIDRs and pools
    /// when they are watched.
    pub(super) fn new(outputs: usize, services: bool, pools: bool) -> Self {
        Lists {
            needed: 2 + outputs + usize::from(services) + usize::from(pools),
            listed: HashSet::new(),
            relist: HashMap::new(),
            configs_list_step: 0,
        }
    }

    pub(super) fn started(&mut self, source: Source, step: u64) {
        if source == Source::Configs {
            self.configs_list_step = step;
        }
        self.relist.insert(source, HashSet::new());
    }

    pub(super) fn saw(&mut self, source: Source, name: String) {
        self.relist.entry(source).or_default().insert(name);
    }

    /// A list is complete: the names it returned.
    pub(super) fn finished(&mut self, source: Source) -> HashSet<String> {
        self.relist.remove(&source).unwrap_or_default()
    }

    /// The watch has listed: whether every watch has by now.
    pub(super) fn listed(&mut self, source: Source) -> bool {
        self.listed.insert(source);
        self.listed.len() >= self.needed
    }

    /// The step at which the config list in progress (or the last one) started.
    pub(super) fn configs_list_step(&self) -> u64 {
        self.configs_list_step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_watch_must_list_once_and_a_relist_counts_once() {
        let mut lists = Lists::new(1, true, false);
        assert!(!lists.listed(Source::Nodes));
        assert!(
            !lists.listed(Source::Nodes),
            "a second node list is not another watch"
        );
        assert!(!lists.listed(Source::Configs));
        assert!(!lists.listed(Source::Output(0)));
        assert!(lists.listed(Source::Services));
    }

    #[test]
    fn a_list_returns_the_names_it_saw_since_it_started() {
        let mut lists = Lists::new(0, false, false);
        lists.saw(Source::Nodes, "before".into());
        lists.started(Source::Nodes, 3);
        lists.saw(Source::Nodes, "a".into());
        lists.saw(Source::Configs, "c".into());
        assert_eq!(
            lists.finished(Source::Nodes),
            HashSet::from(["a".to_string()])
        );
        assert!(lists.finished(Source::Nodes).is_empty(), "handed over once");
        assert_eq!(lists.configs_list_step(), 0, "only a config list moves it");
        lists.started(Source::Configs, 7);
        assert_eq!(lists.configs_list_step(), 7);
        assert!(
            lists.finished(Source::Configs).is_empty(),
            "a new list forgets the old"
        );
    }
}
