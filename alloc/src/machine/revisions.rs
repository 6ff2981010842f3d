//! Storage that went back in time (etcd restored from an older backup): the resourceVersion
//! each watched object was last seen at, and the relist that shows one of them older. After
//! that, nothing is allocated until the process restarts.
//!
//! Why per object, and why only at a relist:
//! - A resourceVersion is an etcd revision (we read it as a `u64`; one that does not parse
//!   is never evidence). The revision an object of one UID is stored at only grows: every
//!   write of it is a later revision. So a list that returns an object at a revision lower
//!   than one we already saw for the same UID is a store that forgot writes. Nothing else
//!   makes it: our lists are consistent reads (kube-runtime's default `MostRecent`), never
//!   served from a cache that may lag (`resourceVersion=0`), and a watch resumes after the
//!   version it last delivered.
//! - The highest version of a whole stream is not sound: an object seen last may have been
//!   deleted since, and a relist whose newest object is older than it is then normal. A
//!   relist with fewer objects is normal too. The list's own resourceVersion would be sound
//!   (it can never go back either), but kube-runtime's watcher does not hand it over.
//! - A restore loses the objects created after the backup: those are not in the relist and
//!   prove nothing. What it shows is any surviving object that was written after the backup
//!   (a kubelet's status update, our own status writes on configs) at its older version.
//!   That holds for `etcdutl snapshot restore --bump-revision --mark-compacted` too: only the
//!   store's revision is bumped, every key keeps the revision of its last write in the
//!   backup, and the compaction makes every watch relist at once.
//!   A backup newer than every write of every surviving object is not detected here; the
//!   runbook says what the operator must do then.

use std::collections::HashMap;

/// What was found: the first object a relist showed older than we had seen it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WentBack {
    /// The watched resource: `nodes`, `nodeipamconfigs`, ...
    pub stream: &'static str,
    pub name: String,
    pub uid: String,
    /// The resourceVersion we saw it at before.
    pub seen: u64,
    /// The resourceVersion the relist returned.
    pub listed: u64,
}

impl std::fmt::Display for WentBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the API's storage went back in time (etcd restored from an older backup?): a \
             relist of {} returned {} (uid {}) at resourceVersion {}, but it was seen at {} \
             before; allocation is stopped until the controller restarts (docs/runbooks.md, \
             NodeIPAMStorageWentBack)",
            self.stream, self.name, self.uid, self.listed, self.seen
        )
    }
}

/// The versions seen per watched stream, carried from one leadership term to the next (a
/// new term relists everything: that relist is compared with what earlier terms saw).
#[derive(Clone, Debug, Default)]
pub struct Revisions {
    streams: HashMap<&'static str, Stream>,
    went_back: Option<WentBack>,
}

#[derive(Clone, Debug, Default)]
struct Stream {
    /// The version each object (by UID) was last seen at.
    seen: HashMap<String, u64>,
    /// A (re)list in progress: what it returned so far. It replaces `seen` when it is done, so
    /// that objects gone while nobody watched are forgotten.
    listing: Option<HashMap<String, u64>>,
}

/// A resourceVersion as an etcd revision; anything else is no evidence.
fn revision(rv: Option<&str>) -> Option<u64> {
    rv?.parse().ok()
}

impl Revisions {
    /// The first object found gone back, if any: from then on nothing is allocated.
    pub fn went_back(&self) -> Option<&WentBack> {
        self.went_back.as_ref()
    }

    /// A (re)list of `stream` starts.
    pub(super) fn list_started(&mut self, stream: &'static str) {
        self.streams.entry(stream).or_default().listing = Some(HashMap::new());
    }

    /// An object of a (re)list: what it shows if it is older than we saw it (the first such
    /// finding is kept).
    pub(super) fn listed(
        &mut self,
        stream: &'static str,
        name: &str,
        uid: Option<&str>,
        rv: Option<&str>,
    ) -> Option<WentBack> {
        let (Some(uid), Some(listed)) = (uid, revision(rv)) else {
            return None;
        };
        let s = self.streams.entry(stream).or_default();
        s.listing
            .get_or_insert_with(HashMap::new)
            .insert(uid.to_string(), listed);
        let seen = *s.seen.get(uid)?;
        if listed >= seen {
            return None;
        }
        let found = WentBack {
            stream,
            name: name.to_string(),
            uid: uid.to_string(),
            seen,
            listed,
        };
        self.went_back.get_or_insert_with(|| found.clone());
        Some(found)
    }

    /// The (re)list of `stream` is complete: what it returned is what we know.
    pub(super) fn list_done(&mut self, stream: &'static str) {
        let s = self.streams.entry(stream).or_default();
        if let Some(listing) = s.listing.take() {
            s.seen = listing;
        }
    }

    /// An object of a watch event (created or changed).
    pub(super) fn applied(&mut self, stream: &'static str, uid: Option<&str>, rv: Option<&str>) {
        let (Some(uid), Some(rv)) = (uid, revision(rv)) else {
            return;
        };
        let seen = self
            .streams
            .entry(stream)
            .or_default()
            .seen
            .entry(uid.to_string())
            .or_insert(rv);
        *seen = (*seen).max(rv);
    }

    /// An object is deleted: its UID never comes back.
    pub(super) fn deleted(&mut self, stream: &'static str, uid: Option<&str>) {
        if let (Some(uid), Some(s)) = (uid, self.streams.get_mut(stream)) {
            s.seen.remove(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relist(r: &mut Revisions, objects: &[(&str, &str, &str)]) -> Option<WentBack> {
        r.list_started("nodes");
        let mut found = None;
        for (name, uid, rv) in objects {
            found = found.or(r.listed("nodes", name, Some(uid), Some(rv)));
        }
        r.list_done("nodes");
        found
    }

    #[test]
    fn a_relist_with_an_object_older_than_seen_is_storage_going_back() {
        let mut r = Revisions::default();
        assert_eq!(
            relist(&mut r, &[("a", "u1", "10"), ("b", "u2", "12")]),
            None
        );
        r.applied("nodes", Some("u1"), Some("20"));
        let found = relist(&mut r, &[("a", "u1", "10"), ("b", "u2", "12")]).expect("found");
        assert_eq!((found.stream, found.name.as_str()), ("nodes", "a"));
        assert_eq!((found.seen, found.listed), (20, 10));
        assert_eq!(r.went_back(), Some(&found));
        assert!(found.to_string().contains("resourceVersion 10"), "{found}");
    }

    #[test]
    fn an_equal_or_newer_relist_is_not() {
        let mut r = Revisions::default();
        relist(&mut r, &[("a", "u1", "10")]);
        r.applied("nodes", Some("u1"), Some("20"));
        assert_eq!(relist(&mut r, &[("a", "u1", "20")]), None);
        assert_eq!(relist(&mut r, &[("a", "u1", "31")]), None);
        assert_eq!(r.went_back(), None);
    }

    #[test]
    fn an_unparsable_or_missing_version_is_no_evidence() {
        let mut r = Revisions::default();
        relist(&mut r, &[("a", "u1", "20")]);
        assert_eq!(relist(&mut r, &[("a", "u1", "not-a-revision")]), None);
        relist(&mut r, &[("a", "u1", "20")]);
        r.list_started("nodes");
        assert_eq!(r.listed("nodes", "a", Some("u1"), None), None);
        assert_eq!(r.listed("nodes", "a", None, Some("3")), None);
        assert_eq!(r.went_back(), None);
    }

    #[test]
    fn fewer_objects_a_deleted_object_and_a_new_uid_are_normal() {
        let mut r = Revisions::default();
        relist(&mut r, &[("a", "u1", "10"), ("b", "u2", "30")]);
        r.deleted("nodes", Some("u2"));
        // b's newest version was 30; a relist whose newest object is 10 is normal.
        assert_eq!(relist(&mut r, &[("a", "u1", "10")]), None);
        // The same name under a new UID starts from its own version.
        r.applied("nodes", Some("u3"), Some("40"));
        assert_eq!(
            relist(&mut r, &[("a", "u1", "10"), ("b", "u4", "35")]),
            None
        );
        assert_eq!(r.went_back(), None);
    }

    #[test]
    fn streams_are_apart_and_the_first_finding_is_kept() {
        let mut r = Revisions::default();
        r.applied("nodes", Some("u1"), Some("50"));
        r.list_started("nodeipamconfigs");
        assert_eq!(
            r.listed("nodeipamconfigs", "c", Some("u1"), Some("5")),
            None
        );
        r.applied("nodes", Some("u2"), Some("60"));
        relist(&mut r, &[("a", "u1", "49"), ("b", "u2", "10")]);
        assert_eq!(r.went_back().map(|w| w.name.as_str()), Some("a"));
    }
}
