//! Streams and their events in Redis ([`EventLog`]): one Redis stream per tether stream, read by
//! range and followed through the heads every replica is told of.

use super::*;

/// A stream's `head`, `state` and `before` fields, as `HMGET` answers them (`None` for a stream
/// that does not exist).
pub(super) type RangeMeta = (Option<u64>, Option<i64>, Option<String>);

/// Queues what a stream's range is read from: its meta, then its first retained event. In one
/// transaction, an append and trim cannot fall between the two.
pub(super) fn queue_range(pipe: &mut redis::Pipeline, session: &str, stream: &str) {
    pipe.cmd("HMGET").arg(stream_key(session, stream)).arg("head").arg("state").arg("before");
    pipe.cmd("XRANGE").arg(events_key(session, stream)).arg("-").arg("+").arg("COUNT").arg(1);
}

/// The range from the answers to [`queue_range`]'s commands.
pub(super) fn range_of((head, state, _): &RangeMeta, first: &Value) -> Option<StreamRange> {
    let (Some(head), Some(state)) = (*head, *state) else { return None };
    let retained_from = first_id(first).and_then(|id| parse_seq(&id)).unwrap_or(head + 1);
    let state = match state {
        0 => StreamState::Live,
        1 => StreamState::Complete,
        _ => StreamState::Aborted,
    };
    Some(StreamRange { retained_from, head, state })
}

/// Reads up to `max` events of a stream from `from` on.
pub(super) fn page_cmd(session: &str, stream: &str, from: u64, max: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("XRANGE");
    cmd.arg(events_key(session, stream)).arg(format!("{from}-1")).arg("+").arg("COUNT").arg(max.min(1 << 20));
    cmd
}

pub(super) fn parse_seq(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

impl EventLog for RedisStore {
    fn open_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let stream_name = stream.clone();
        let (session, epoch, stream) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        Box::pin(async move {
            let mut conn = self.conn();
            let [m, s, e, set] = Self::stream_keys(&session, &stream);
            scripts()
                .open
                .key(m)
                .key(s)
                .key(e)
                .key(set)
                .arg(epoch)
                .arg(&stream)
                .arg(&self.owner)
                .arg("")
                .arg(Tag::priming(&stream_name).to_string())
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(script_error)?;
            self.fenced(&mut conn, &[&meta(&session)]).await
        })
    }

    fn begin_request(&self, request: RequestRecord<'_>) -> StoreFuture<'_, BeginRequest> {
        let (session, epoch, key, digest) = (
            request.session.as_str().to_owned(),
            request.epoch.to_string(),
            request.key.encode(),
            request.params_digest.to_owned(),
        );
        let stream_name = request.stream.clone();
        let stream = request.stream.to_string();
        Box::pin(async move {
            let mut conn = self.conn();
            let [m, s, e, set] = Self::stream_keys(&session, &stream);
            let member = owned_member(&session, &stream);
            let mut begin = scripts().begin.key(m);
            begin
                .key(s)
                .key(e)
                .key(set)
                .key(requests_key(&session))
                .key(request_order_key(&session))
                .arg(epoch)
                .arg(&stream)
                .arg(&self.owner)
                .arg(&key)
                .arg(&key)
                .arg(&digest)
                .arg(self.retention.max_tombstones_per_session())
                .arg(Tag::priming(&stream_name).to_string());
            // The stream joins this process's owned set before it exists: if the process dies
            // once the stream exists, its request is found and aborted, never left live. On one
            // server both are queued in that order on the shared connection and go in one round
            // trip; on a cluster they may go to two shards, so the begin waits for the set.
            let mut owned = conn.clone();
            let fresh = self.held().streams.insert(member.clone());
            let (added, begun) = if self.deployment.is_cluster() {
                let added = owned.sadd::<_, _, i64>(owned_key(&self.owner), &member).await;
                (added, begin.invoke_async::<String>(&mut conn).await)
            } else {
                tokio::join!(
                    owned.sadd::<_, _, i64>(owned_key(&self.owner), &member),
                    begin.invoke_async::<String>(&mut conn)
                )
            };
            let existing = begun.map_err(script_error);
            if fresh && !matches!(existing.as_deref(), Ok("")) {
                self.held().streams.remove(&member);
            }
            if matches!(existing.as_deref(), Ok("")) {
                // Begun: failing the call now would leave a live stream nobody runs. Without its
                // entry the request runs and ends as usual; only a crash would strand it.
                if let Err(err) = added {
                    tracing::warn!(%err, session, stream, "a begun request is missing from its owner's set");
                }
                if let Err(err) = self.fenced(&mut conn, &[&meta(&session), &owned_key(&self.owner)]).await {
                    // Not acknowledged, so the request will not run: its stream ends aborted
                    // rather than wait live for ever (on a connection of its own: the fence's may
                    // be the one that failed).
                    let mut conn = self.conn();
                    let abort = self.abort_script(&session, &stream, &self.owner);
                    if let Err(err) = abort.invoke_async::<i64>(&mut conn).await {
                        tracing::warn!(%err, session, stream, "could not abort a request that was not acknowledged");
                    }
                    self.retire_stream(&mut conn, &session, &stream).await;
                    return Err(err);
                }
                return Ok(BeginRequest::Started);
            }
            // Not begun here: the entry comes out again. Were it left, it would only grow the set
            // (the abort script checks the owner), so this is best effort.
            if added.is_ok()
                && let Err(err) = conn.srem::<_, _, i64>(owned_key(&self.owner), &member).await
            {
                tracing::debug!(%err, "could not take a request that was not begun out of the owner's set");
            }
            let existing = existing?;
            let (existing_digest, existing_stream) =
                existing.split_once(SEP).ok_or_else(|| backend("bad request record"))?;
            Ok(BeginRequest::Existing {
                stream: StreamName::parse(existing_stream).map_err(backend)?,
                same_params: existing_digest == digest,
            })
        })
    }

    fn append_batch(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
    ) -> StoreFuture<'_, u64> {
        let (session, epoch, stream) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        Box::pin(async move {
            let mut conn = self.conn();
            let [m, s, e, set] = Self::stream_keys(&session, &stream);
            let script = &scripts().append;
            let mut invocation = script.key(m);
            invocation
                .key(s)
                .key(e)
                .key(set)
                .arg(epoch)
                .arg(if last { "1" } else { "0" })
                .arg(self.retention.max_events_per_stream.max(1))
                .arg(self.retention.max_bytes_per_session)
                .arg(notification_prefix(&session, &stream))
                .arg(format!("tether:{{{session}}}:"))
                .arg(&stream)
                .arg(self.retention.max_tombstones_per_session())
                .arg(self.notify_args(&session));
            for (data, tag) in events.iter().zip(crate::tags::fresh_n(events.len())) {
                invocation.arg(&data[..]).arg(tag.to_string());
            }
            let seq: u64 = invocation.invoke_async(&mut conn).await.map_err(script_error)?;
            if last {
                self.retire_stream(&mut conn, &session, &stream).await;
            }
            self.fenced(&mut conn, &[&meta(&session)]).await?;
            // Local followers need not wait for the round trip through pub/sub.
            if let Ok(name) = StreamName::parse(&stream) {
                self.heads.notify(&session, &name, seq);
            }
            Ok(seq)
        })
    }

    fn end_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        Box::pin(async move {
            let mut conn = self.conn();
            let [m, s, _, _] = Self::stream_keys(&session, &stream);
            scripts()
                .end_stream
                .key(m)
                .key(s)
                .arg(epoch)
                .arg(notification_prefix(&session, &stream))
                .arg(self.notify_args(&session))
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(script_error)?;
            self.retire_stream(&mut conn, &session, &stream).await;
            self.fenced(&mut conn, &[&meta(&session)]).await
        })
    }

    fn abort_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream) = (session.clone(), epoch.clone(), stream.clone());
        Box::pin(async move {
            let mut conn = self.conn();
            if !matches!(self.session(&session, 0).await?, SessionStatus::Live(record) if record.epoch == epoch) {
                return Err(StoreError::SessionGone);
            }
            let (session, stream) = (session.as_str(), stream.as_str());
            let _: i64 =
                self.abort_script(session, stream, &self.owner).invoke_async(&mut conn).await.map_err(backend)?;
            self.retire_stream(&mut conn, session, stream).await;
            self.fenced(&mut conn, &[&meta(session)]).await
        })
    }

    fn stream_range(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<StreamRange>> {
        let mut pipe = redis::pipe();
        queue_range(pipe.atomic(), session.as_str(), stream.as_str());
        Box::pin(async move {
            let (meta, first): (RangeMeta, Value) = pipe.query_async(&mut self.conn()).await.map_err(backend)?;
            Ok(range_of(&meta, &first))
        })
    }

    fn stream_request(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<RequestKey>> {
        let key = stream_key(session.as_str(), stream.as_str());
        Box::pin(async move {
            let mut conn = self.conn();
            let rk: Option<String> = conn.hget(key, "rk").await.map_err(backend)?;
            rk.filter(|k| !k.is_empty()).map(|k| RequestKey::parse(&k)).transpose().map_err(backend)
        })
    }

    fn read(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Vec<StoredEvent>> {
        let read = page_cmd(session.as_str(), stream.as_str(), after.saturating_add(1), max);
        Box::pin(async move {
            let reply: Value = read.query_async(&mut self.conn()).await.map_err(backend)?;
            Ok(stream_entries(&reply))
        })
    }

    /// The range and the page in one transaction: one round trip per page read by a response,
    /// a replay or a relay. The page starts at the cursor's own event, for its tag.
    fn read_page(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Option<StreamPage>> {
        let mut pipe = redis::pipe();
        queue_range(pipe.atomic(), session.as_str(), stream.as_str());
        pipe.add_command(page_cmd(session.as_str(), stream.as_str(), after, max.saturating_add(1)));
        Box::pin(async move {
            let (meta, first, page): (RangeMeta, Value, Value) =
                pipe.query_async(&mut self.conn()).await.map_err(backend)?;
            let Some(range) = range_of(&meta, &first) else { return Ok(None) };
            let before_retained = meta.2.as_deref().map(Tag::parse).transpose().map_err(backend)?;
            let mut events = stream_entries(&page);
            let own = events.first().filter(|event| event.seq == after).map(|event| event.tag);
            if own.is_some() {
                events.remove(0);
            }
            events.truncate(max);
            let at_cursor = if after.checked_add(1) == Some(range.retained_from) { before_retained } else { own };
            Ok(Some(StreamPage { range, at_cursor, before_retained, events }))
        })
    }

    fn watch(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, HeadWatch> {
        let range = self.stream_range(session, stream);
        let key = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            self.hear_session(&key.0).await?;
            let range = range.await?.ok_or(StoreError::UnknownStream)?;
            Ok(self.heads.subscribe(&key.0, &key.1, range.head))
        })
    }

    fn retained_bytes(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// The id of the first entry of an XRANGE reply.
pub(super) fn first_id(reply: &Value) -> Option<String> {
    match reply {
        Value::Array(entries) => match entries.first()? {
            Value::Array(entry) => match entry.first()? {
                Value::BulkString(id) => String::from_utf8(id.clone()).ok(),
                Value::SimpleString(id) => Some(id.clone()),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// The events of an XRANGE reply (`[[id, [field, value]], ...]`).
pub(super) fn stream_entries(reply: &Value) -> Vec<StoredEvent> {
    let Value::Array(entries) = reply else { return Vec::new() };
    entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(entry) = entry else { return None };
            let id = match entry.first()? {
                Value::BulkString(id) => String::from_utf8(id.clone()).ok()?,
                Value::SimpleString(id) => id.clone(),
                _ => return None,
            };
            let Value::Array(fields) = entry.get(1)? else { return None };
            let (mut data, mut tag) = (Bytes::new(), None);
            for pair in fields.chunks_exact(2) {
                match (&pair[0], &pair[1]) {
                    (Value::BulkString(name), Value::BulkString(value)) if name == b"d" => {
                        data = Bytes::from(value.clone());
                    }
                    (Value::BulkString(name), Value::BulkString(value)) if name == b"t" => {
                        tag = std::str::from_utf8(value).ok().and_then(|t| Tag::parse(t).ok());
                    }
                    _ => {}
                }
            }
            // An entry stored before events had tags reads as tag 0, as the embedded store's
            // rows of that time do: the same every time it is read.
            Some(StoredEvent { seq: parse_seq(&id)?, tag: tag.unwrap_or(Tag::from_bits(0)), data })
        })
        .collect()
}
