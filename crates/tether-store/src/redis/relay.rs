//! The relay between replicas over Redis ([`Relay`]).

use super::*;

impl Relay for RedisStore {
    fn relay_answer(&self, answer: RelayedAnswer) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let mut payload = format!("{}{SEP}{}{SEP}", answer.session, answer.request_id).into_bytes();
            payload.extend_from_slice(&answer.response);
            Ok(self.publish(ANSWERS, payload).await? > 0)
        })
    }

    fn relayed_answers(&self) -> Option<tokio::sync::broadcast::Receiver<RelayedAnswer>> {
        Some(self.answers.subscribe())
    }

    fn announce(&self, announcement: Bytes) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut payload = format!("{}{SEP}", self.owner).into_bytes();
            payload.extend_from_slice(&announcement);
            self.publish(ANNOUNCEMENTS, payload).await?;
            Ok(())
        })
    }

    fn announcements(&self) -> Option<tokio::sync::broadcast::Receiver<Bytes>> {
        Some(self.announcements.subscribe())
    }

    fn session_replica(&self, session: &SessionId) -> StoreFuture<'_, Option<ReplicaId>> {
        let key = meta(session.as_str());
        Box::pin(async move {
            let replica: Option<String> = self.conn().hget(key, "replica").await.map_err(backend)?;
            // A record without a replica (or with a name no replica could have) has no holder.
            Ok(replica.and_then(|replica| ReplicaId::parse(&replica).ok()))
        })
    }

    fn replica_alive(&self, replica: &ReplicaId, now_ms: u64) -> StoreFuture<'_, bool> {
        let replica = replica.as_str().to_owned();
        Box::pin(async move { self.owner_alive(&mut self.conn(), &replica, now_ms).await })
    }

    fn send_to_replica(&self, to: &ReplicaId, body: Bytes) -> StoreFuture<'_, bool> {
        let channel = replica_channel(to.as_str());
        Box::pin(async move {
            let mut payload = format!("{}{SEP}", self.owner).into_bytes();
            payload.extend_from_slice(&body);
            Ok(self.publish(&channel, payload).await? > 0)
        })
    }

    fn replica_messages(&self) -> Option<tokio::sync::broadcast::Receiver<ReplicaMessage>> {
        Some(self.replica_messages.subscribe())
    }
}
