//! Following a stored stream from a cursor to its end: the one place that reads a stream for
//! a connection (a POST's answer, a resume), for a request attached to another's stream, and
//! for a batch. What it yields is decided by [`next_after`]: every retained event after the
//! cursor once, in order; each part that is gone once, as a notice standing where it was; then
//! how the stream ended. Every page is first held to what the reader already yielded
//! ([`check_position`]): a store that went back in time under it ends the stream, never
//! continues it.

use std::sync::Arc;

use tether_core::lineage::{Next, ResyncNotice, SessionId, StreamName, Tag, check_position, next_after};
use tether_store::{HeadWatch, Store, StoreError, StoredEvent, StreamPage};

/// Events read from the store per round trip.
const READ_BATCH: usize = 256;

/// What follows the cursor.
#[derive(Debug)]
pub(crate) enum Item {
    /// The next retained event.
    Event(StoredEvent),
    /// Events after the cursor that are gone: one resync event says so
    /// ([`ResyncNotice::position`] and the tag of the event there are its id), and the stream
    /// goes on after them.
    Gap(ResyncNotice, Option<Tag>),
    /// The stream ended; nothing follows.
    End(Ending),
}

/// How a followed stream ended.
#[derive(Debug)]
pub(crate) enum Ending {
    /// Its producer finished. `response_lost`: the stream's last event (a request's response)
    /// went in the gap just before the end, so the reader never gets it.
    Complete { response_lost: bool },
    /// Its producer died after the events read: the `request_aborted` notice to send, and the
    /// tag of the event at its position.
    Aborted(ResyncNotice, Option<Tag>),
    /// The stream (or its session) no longer exists.
    Gone,
    /// The store no longer holds what the reader yielded: it went back in time.
    Rewritten,
}

/// A reader of one stored stream.
pub(crate) struct StreamReader {
    store: Arc<dyn Store>,
    session: SessionId,
    stream: StreamName,
    /// The last position read (or accounted for by a gap).
    cursor: u64,
    /// The tag of the event at `cursor`, as the reader yielded it or was given it; `None` until
    /// a page tells it (or where the store no longer can).
    tag: Option<Tag>,

    /// Made once the stream has to be waited for: most are whole by the time they are read,
    /// and a watch costs the store a registration.
    head: Option<HeadWatch>,
    /// The last position read is gone: a stream that ends there lost its last event (the gap
    /// just read took it, or the cursor itself stood for it: a resume from a gap's notice).
    after_gap: bool,
    /// Whether a page was read yet.
    started: bool,
    done: bool,
}

impl StreamReader {
    /// A reader of `stream` of `session` that yields what follows `cursor`, whose event's tag
    /// it learns from the store.
    pub fn new(store: Arc<dyn Store>, session: &SessionId, stream: StreamName, cursor: u64) -> StreamReader {
        StreamReader::resumed(store, session, stream, cursor, None)
    }

    /// A reader of `stream` of `session` that yields what follows `cursor`, where a client saw
    /// the event tagged `tag`: the store must still hold it there.
    pub fn resumed(
        store: Arc<dyn Store>,
        session: &SessionId,
        stream: StreamName,
        cursor: u64,
        tag: Option<Tag>,
    ) -> StreamReader {
        StreamReader {
            store,
            session: session.clone(),
            stream,
            cursor,
            tag,
            head: None,
            after_gap: false,
            started: false,
            done: false,
        }
    }

    /// The stream followed.
    pub fn stream(&self) -> &StreamName {
        &self.stream
    }

    /// The items that follow the cursor now, in order, up to one page of events; empty when
    /// nothing follows yet (then [`StreamReader::changed`] waits for more). After an
    /// [`Item::End`], always empty.
    pub async fn read(&mut self) -> Result<Vec<Item>, StoreError> {
        if self.done {
            return Ok(Vec::new());
        }
        loop {
            if let Some(head) = &mut self.head {
                head.borrow_and_update();
            }
            let page = self.store.read_page(&self.session, &self.stream, self.cursor, READ_BATCH).await?;
            let Some(page) = page else {
                self.done = true;
                return Ok(vec![Item::End(Ending::Gone)]);
            };
            match self.tag {
                Some(seen) if check_position(page.at(), self.cursor, seen).is_err() => {
                    self.done = true;
                    return Ok(vec![Item::End(Ending::Rewritten)]);
                }
                Some(_) => {}
                None => self.tag = page.at_cursor,
            }
            let StreamPage { range, before_retained, events, .. } = page;
            if !std::mem::replace(&mut self.started, true) {
                self.after_gap = self.cursor > 0 && range.retained_from > self.cursor;
            }
            let mut items = Vec::with_capacity(events.len() + 1);
            // A full page may stop short of what is retained: read on from its end next time.
            let full = events.len() >= READ_BATCH;
            let mut events = events.into_iter().peekable();
            loop {
                if full && events.peek().is_none() {
                    return Ok(items);
                }
                match next_after(self.cursor, range, events.peek().map(|e| e.seq)) {
                    Next::Events => {
                        // The page is contiguous: its next event is the one after the cursor.
                        let Some(event) = events.next() else { break };
                        self.cursor = event.seq;
                        self.tag = Some(event.tag);
                        self.after_gap = false;
                        items.push(Item::Event(event));
                    }
                    Next::Gap(lost) => {
                        // A gap ends where what is retained begins (or at the head, when nothing
                        // is): at the last event dropped.
                        self.cursor = lost.to;
                        self.tag = before_retained;
                        self.after_gap = true;
                        let notice = ResyncNotice::evicted(self.stream.as_str(), lost, range.head);
                        items.push(Item::Gap(notice, before_retained));
                    }
                    Next::Wait => break,
                    Next::End => {
                        self.done = true;
                        items.push(Item::End(Ending::Complete { response_lost: self.after_gap }));
                        break;
                    }
                    Next::Aborted => {
                        self.done = true;
                        let notice = ResyncNotice::aborted(self.stream.as_str(), range.head);
                        items.push(Item::End(Ending::Aborted(notice, self.tag)));
                        break;
                    }
                }
            }
            if !items.is_empty() || self.head.is_some() {
                return Ok(items);
            }
            // Nothing yet: watch the stream, then read again, so nothing appended meanwhile is
            // missed.
            self.head = Some(self.store.watch(&self.session, &self.stream).await?);
        }
    }

    /// Waits until the stream's head moves; `Err` when the stream or its session is gone.
    pub async fn changed(&mut self) -> Result<(), StoreError> {
        match &mut self.head {
            Some(head) => head.changed().await.map_err(|_| StoreError::UnknownStream),
            // Nothing to wait for: read again.
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tether_store::{MemoryStore, Retention};

    use super::*;

    /// A store keeping one event per stream, with session `s` holding stream `r`, ended after
    /// three events: only the third, its response, is retained.
    async fn trimmed_stream() -> (Arc<dyn Store>, SessionId, StreamName) {
        let store: Arc<dyn Store> =
            Arc::new(MemoryStore::new(Retention { max_events_per_stream: 1, ..Retention::default() }));
        let record = crate::session::test_record(60_000, 60_000);
        store.create_session(record.clone(), usize::MAX).await.expect("create");
        let stream = StreamName::parse("r").expect("stream name");
        store.open_stream(&record.id, &record.epoch, &stream).await.expect("open");
        for (n, last) in [(1, false), (2, false), (3, true)] {
            store.append(&record.id, &record.epoch, &stream, Bytes::from(format!("e{n}")), last).await.expect("append");
        }
        let range = store.stream_range(&record.id, &stream).await.expect("range").expect("known");
        assert_eq!((range.retained_from, range.head), (3, 3), "only the response is retained");
        (store, record.id, stream)
    }

    /// Resumed from the first retained event, the response itself, nothing after it is missing:
    /// the stream just ends, with no trailer saying the response was lost.
    #[tokio::test]
    async fn a_resume_from_the_first_retained_event_has_lost_nothing() {
        let (store, session, stream) = trimmed_stream().await;
        let items = StreamReader::new(store, &session, stream, 3).read().await.expect("read");
        assert!(matches!(items[..], [Item::End(Ending::Complete { response_lost: false })]), "{items:?}");
    }

    /// Resumed from an evicted event, the reader says what is gone, then gives the response.
    #[tokio::test]
    async fn a_resume_from_an_evicted_event_gets_the_gap_then_the_response() {
        let (store, session, stream) = trimmed_stream().await;
        let items = StreamReader::new(store, &session, stream, 1).read().await.expect("read");
        assert!(
            matches!(
                &items[..],
                [
                    Item::Gap(..),
                    Item::Event(StoredEvent { seq: 3, .. }),
                    Item::End(Ending::Complete { response_lost: false })
                ]
            ),
            "{items:?}"
        );
    }
}
