//! What the replicas sharing a Redis publish to each other, and the one subscription that hands
//! it to this process: stream heads, clients' answers, announcements, task changes and messages
//! for this replica.
//!
//! On one server (or the primary behind Sentinels) this is one subscription to fixed channels.
//! On a cluster, every channel is sharded: the fixed ones each on the shard of its name, and
//! appends on each session's own channel, heard only while some connection here follows one of
//! its streams ([`RedisStore::hear_session`]).

use super::*;

pub(super) async fn subscribe(client: &redis::Client, owner: &str) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(NOTIFY).await?;
    for channel in fixed_channels(owner) {
        pubsub.subscribe(channel).await?;
    }
    Ok(pubsub)
}

/// The channels every replica hears, but the notifications of appends.
fn fixed_channels(owner: &str) -> [String; 4] {
    [ANSWERS.to_owned(), TASK_CHANGES.to_owned(), ANNOUNCEMENTS.to_owned(), replica_channel(owner)]
}

/// On a cluster, subscribes to the fixed channels, each on its shard.
pub(super) async fn subscribe_shards(subscriber: &mut ClusterConnection, owner: &str) -> redis::RedisResult<()> {
    for channel in fixed_channels(owner) {
        subscriber.ssubscribe(channel).await?;
    }
    Ok(())
}

/// What [`listen`] receives from.
pub(super) enum Subscription {
    /// One server's subscription.
    Server(redis::aio::PubSub),
    /// A cluster's sharded subscriptions, as pushes of its subscriber connection.
    Shards(tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>),
}

/// Where [`listen`] hands what the other replicas publish.
pub(super) struct Listeners {
    /// This process's name: its own announcements are not for it.
    pub(super) owner: String,
    pub(super) heads: Arc<Heads>,
    pub(super) answers: tokio::sync::broadcast::Sender<RelayedAnswer>,
    pub(super) task_changes: tokio::sync::broadcast::Sender<TaskId>,
    pub(super) announcements: tokio::sync::broadcast::Sender<Bytes>,
    pub(super) replica_messages: tokio::sync::broadcast::Sender<ReplicaMessage>,
}

impl Listeners {
    /// Hands on what arrived on `channel`.
    fn dispatch(&self, channel: &str, payload: &[u8]) {
        if channel == replica_channel(&self.owner) {
            let mut parts = payload.splitn(2, |b| *b == SEP as u8);
            if let (Some(from), Some(body)) = (parts.next(), parts.next())
                && let Ok(from) = ReplicaId::parse(&String::from_utf8_lossy(from))
            {
                let _ = self.replica_messages.send(ReplicaMessage { from, body: Bytes::copy_from_slice(body) });
            }
            return;
        }
        if channel == ANNOUNCEMENTS {
            let mut parts = payload.splitn(2, |b| *b == SEP as u8);
            if let (Some(from), Some(announcement)) = (parts.next(), parts.next())
                && from != self.owner.as_bytes()
            {
                let _ = self.announcements.send(Bytes::copy_from_slice(announcement));
            }
            return;
        }
        if channel == TASK_CHANGES {
            if let Ok(id) = TaskId::parse(&String::from_utf8_lossy(payload)) {
                let _ = self.task_changes.send(id);
            }
            return;
        }
        if channel == ANSWERS {
            let mut parts = payload.splitn(3, |b| *b == SEP as u8);
            if let (Some(session), Some(id), Some(response)) = (parts.next(), parts.next(), parts.next())
                && let Ok(session) = SessionId::parse(&String::from_utf8_lossy(session))
            {
                let _ = self.answers.send(RelayedAnswer {
                    session,
                    request_id: String::from_utf8_lossy(id).into_owned(),
                    response: Bytes::copy_from_slice(response),
                });
            }
            return;
        }
        let payload = String::from_utf8_lossy(payload);
        let mut parts = payload.split(SEP);
        let (Some(session), Some(stream), Some(seq)) = (parts.next(), parts.next(), parts.next()) else { return };
        let (Ok(stream), Ok(seq)) = (StreamName::parse(stream), seq.parse::<u64>()) else { return };
        self.heads.notify(session, &stream, seq);
    }

    /// A cluster's push: a message, a subscription made (again, after a failover or a slot
    /// moved: the session's followers re-read what they may have missed meanwhile), or the loss
    /// of a node's connection (every follower re-reads).
    fn pushed(&self, push: redis::PushInfo) {
        let text = |value: Option<&Value>| match value {
            Some(Value::BulkString(bytes)) => Some(bytes.clone()),
            Some(Value::SimpleString(text)) => Some(text.clone().into_bytes()),
            _ => None,
        };
        match push.kind {
            redis::PushKind::Message | redis::PushKind::SMessage => {
                if let (Some(channel), Some(payload)) = (text(push.data.first()), text(push.data.get(1))) {
                    self.dispatch(&String::from_utf8_lossy(&channel), &payload);
                }
            }
            redis::PushKind::SSubscribe => {
                if let Some(channel) = text(push.data.first())
                    && let Some(session) = notified_session(&String::from_utf8_lossy(&channel))
                {
                    self.heads.wake_session(session);
                }
            }
            redis::PushKind::Disconnection => self.heads.wake_all(),
            _ => {}
        }
    }
}

/// Turns notifications into wake-ups of local followers and relayed answers into messages for
/// local handlers. If one server's subscription drops, it subscribes again (behind Sentinels, on
/// the primary they name now) and wakes every follower, so none waits for a notification lost
/// in between; a cluster's connection subscribes again by itself.
pub(super) async fn listen(deployment: Deployment, subscription: Subscription, to: Listeners) {
    let mut pubsub = match subscription {
        Subscription::Shards(mut pushes) => {
            while let Some(push) = pushes.recv().await {
                to.pushed(push);
            }
            return;
        }
        Subscription::Server(pubsub) => pubsub,
    };
    loop {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            to.dispatch(message.get_channel_name(), message.get_payload_bytes());
        }
        tracing::warn!("redis subscription lost; resubscribing");
        pubsub = loop {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let subscribed = match deployment.subscriber().await {
                Ok(client) => subscribe(&client, &to.owner).await.map_err(backend),
                Err(err) => Err(err),
            };
            match subscribed {
                Ok(pubsub) => break pubsub,
                Err(err) => tracing::warn!(%err, "redis resubscribe failed"),
            }
        };
        to.heads.wake_all();
    }
}
