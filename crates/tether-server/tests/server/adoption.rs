//! A session one replica began is served by another sharing its store only once that replica's
//! handler adopts it (`Handler::adopts`), whatever reached the replica first: a request, or a
//! resumed stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use tether_builtin::BuiltinHandler;
use tether_server::{AdoptFuture, Builder, Context, Handler, HandlerFuture, ServerInfo, SessionHandle};
use tether_store::{MemoryStore, Retention, Store};

use crate::common::*;

/// A replica whose sessions live in the process that began them: it adopts none, and counts the
/// calls it runs.
#[derive(Default)]
struct Unadopting {
    runs: Arc<AtomicUsize>,
}

impl Handler for Unadopting {
    fn info(&self) -> ServerInfo {
        tools_info("unadopting")
    }

    fn call(&self, _ctx: Context, _method: String, _params: Value) -> HandlerFuture {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(Ok(json!({"content": []}))))
    }

    fn adopts(&self, _session: &SessionHandle) -> AdoptFuture {
        Box::pin(std::future::ready(false))
    }
}

#[tokio::test]
async fn a_resumed_stream_does_not_let_a_replica_skip_adopting_the_session() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(Retention::default()));
    let began = start_with(Builder::new(BuiltinHandler::in_memory()).config(config()).store(Arc::clone(&store))).await;
    let handler = Unadopting::default();
    let runs = Arc::clone(&handler.runs);
    let other = start_with(Builder::new(handler).config(config()).store(store)).await;
    let (at_began, at_other) = (Client::new(&began), Client::new(&other));
    let session = at_began.initialize("2025-11-25").await;

    // The standalone stream opened where the session began: its priming event is a cursor.
    let mut stream = at_began.get(&session, None).send().await.expect("GET");
    let primed = events(&mut stream, 1).await;
    let cursor = primed.first().and_then(|event| event.id.clone()).expect("a priming event with an id");
    drop(stream);

    // Resumed at the other replica: reading a stream needs no adoption.
    let mut resumed = at_other.get(&session, Some(&cursor)).send().await.expect("resume");
    assert_eq!(resumed.status(), 200);
    let _ = tokio::time::timeout(std::time::Duration::from_millis(200), resumed.chunk()).await;
    drop(resumed);

    // A request there is the other replica's to run only if it adopts the session: it does not.
    let response = at_other.call(&session, json!(1), "anything", json!({})).await;
    assert_eq!(response.status(), 404);
    assert_eq!(reason(response).await, "upstream_lost");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no request ran where the session could not be served");
}
