//! Publishes Kubernetes Events on Nodes, NodeIPAMConfigs, NodeIPAMPools and the Lease, off the
//! allocation loop, so a slow events API never delays an allocation. Events are best effort:
//! a failure is logged, a refusal (our event is wrong, not the API busy) as a warning.
//!
//! kube's `Recorder` names an event `<object>.<nanoseconds in hex>`, which the API server
//! refuses for an object whose name is longer than 236 characters (names may have 253); such
//! an event is created here under a name cut to fit ([`event_name`]), without the Recorder's
//! series, so that no object the API admits is one we cannot tell its owner about.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Error};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::MANAGER;
use crate::alloc::effects::Note;
use crate::ratelimit::RateLimiter;

/// Longest object name (a DNS subdomain), the event's included.
const MAX_NAME: usize = 253;

/// What the Recorder appends to the object's name: a dot and up to 16 hex digits.
const SUFFIX_ROOM: usize = 17;

/// The events API caps an event's note at 1 kB.
const MAX_NOTE: usize = 1000;

/// Publishes each note as an event, each taking a token from `budget` first: the client's
/// layer charges only its reads (`ratelimit::Charge::Reads`), and a burst of notes (thousands
/// of nodes told there is no block) must not reach the API server faster than the writes may.
pub async fn run(
    client: Client,
    budget: Arc<RateLimiter>,
    instance: Option<String>,
    mut notes: mpsc::UnboundedReceiver<Note>,
) {
    let events = Events::new(client, instance);
    while let Some(note) = notes.recv().await {
        budget.acquire().await;
        let type_ = if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        events
            .publish(
                type_,
                note.reason,
                note.action,
                &note.message,
                &note.regarding,
            )
            .await;
    }
}

/// Our events, as one reporting controller and instance.
pub struct Events {
    recorder: Recorder,
    client: Client,
    reporter: Reporter,
}

impl Events {
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
        }
    }

    /// Publishes one event about `regarding`, logging a failure.
    pub async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        message: &str,
        regarding: &ObjectReference,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(message, MAX_NOTE)),
            action: action.into(),
            secondary: None,
        };
        let name = regarding.name.as_deref().unwrap_or_default();
        let sent = if name.len() + SUFFIX_ROOM <= MAX_NAME {
            self.recorder.publish(&event, regarding).await
        } else {
            self.create_cut(&event, regarding).await
        };
        match sent {
            Ok(()) => {}
            Err(Error::Api(s)) if matches!(s.code, 400 | 422) => {
                warn!(object = name, reason, error = %s.message, "the API server refused an event");
            }
            Err(e) => debug!(object = name, reason, error = %e, "publishing an event failed"),
        }
    }

    /// An event about an object too long-named for the Recorder's event name.
    async fn create_cut(&self, event: &Event, regarding: &ObjectReference) -> Result<(), Error> {
        let now = Timestamp::now();
        let name = event_name(
            regarding.name.as_deref().unwrap_or_default(),
            now.as_nanosecond(),
        );
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let object = K8sEvent {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(match event.type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            ..K8sEvent::default()
        };
        Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &object)
            .await
            .map(drop)
    }
}

/// The Recorder's name for an event about `object` at `nanos` (`<object>.<nanos in hex>`), with
/// the object's name cut so that the whole is at most 253 characters and still a DNS subdomain
/// (no label ends in '-' or '.' where the cut falls).
pub fn event_name(object: &str, nanos: i128) -> String {
    let suffix = format!(".{nanos:x}");
    let room = MAX_NAME.saturating_sub(suffix.len());
    let mut end = object.len().min(room);
    while !object.is_char_boundary(end) {
        end -= 1;
    }
    let head = object[..end].trim_end_matches(['-', '.']);
    format!("{head}{suffix}")
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DNS subdomain as the API server checks object names.
    fn is_dns_subdomain(s: &str) -> bool {
        s.len() <= MAX_NAME
            && s.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn an_event_name_fits_whatever_the_objects_name() {
        let nanos = 1_800_000_000_123_456_789_i128;
        let short = event_name("node-1", nanos);
        assert_eq!(
            short,
            format!("node-1.{nanos:x}"),
            "short names are kept whole"
        );
        for object in [
            "n".repeat(236),
            "n".repeat(237),
            "n".repeat(253),
            format!("{}-{}", "a".repeat(234), "b".repeat(18)),
            format!("{}.{}", "a".repeat(235), "b".repeat(17)),
        ] {
            let name = event_name(&object, nanos);
            assert!(is_dns_subdomain(&name), "{name:?} ({} chars)", name.len());
            let suffix = format!(".{nanos:x}");
            let head = name.strip_suffix(&suffix).expect("the time suffix");
            assert!(object.starts_with(head), "{head} is a prefix of {object}");
        }
        let exact = "n".repeat(236);
        assert_eq!(event_name(&exact, nanos), format!("{exact}.{nanos:x}"));
    }

    #[test]
    fn a_long_note_is_cut_on_a_character() {
        let note = "é".repeat(600);
        let cut = truncate(&note, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }
}
