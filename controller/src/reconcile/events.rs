//! Publishes Kubernetes Events on Nodes and NodeIPAMConfigs off the allocation loop, so a slow
//! events API never delays an allocation. Events are best effort: a failure is logged.

use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tracing::debug;

use super::MANAGER;
use crate::alloc::effects::Note;

pub async fn run(
    client: Client,
    instance: Option<String>,
    mut notes: mpsc::UnboundedReceiver<Note>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: MANAGER.into(),
            instance,
        },
    );
    while let Some(note) = notes.recv().await {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.into(),
            // The events API caps the note at 1 kB.
            note: Some(truncate(&note.message, 1000)),
            action: note.action.into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &note.regarding).await {
            debug!(error = %e, reason = note.reason, "publishing an event failed");
        }
    }
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
