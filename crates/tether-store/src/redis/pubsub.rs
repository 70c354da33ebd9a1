//! What the replicas sharing a Redis publish to each other, and the one subscription that hands
//! it to this process: stream heads, clients' answers, announcements, task changes and messages
//! for this replica.

use super::*;

pub(super) async fn subscribe(client: &redis::Client, owner: &str) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(NOTIFY).await?;
    pubsub.subscribe(ANSWERS).await?;
    pubsub.subscribe(TASK_CHANGES).await?;
    pubsub.subscribe(ANNOUNCEMENTS).await?;
    pubsub.subscribe(replica_channel(owner)).await?;
    Ok(pubsub)
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

/// Turns notifications into wake-ups of local followers and relayed answers into messages for
/// local handlers. If the subscription drops, it resubscribes and wakes every follower, so none
/// waits for a notification lost in between.
pub(super) async fn listen(client: redis::Client, mut pubsub: redis::aio::PubSub, to: Listeners) {
    let Listeners { owner, heads, answers, task_changes, announcements, replica_messages } = to;
    let mine = replica_channel(&owner);
    loop {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            if message.get_channel_name() == mine {
                let payload = message.get_payload_bytes();
                let mut parts = payload.splitn(2, |b| *b == SEP as u8);
                if let (Some(from), Some(body)) = (parts.next(), parts.next())
                    && let Ok(from) = ReplicaId::parse(&String::from_utf8_lossy(from))
                {
                    let _ = replica_messages.send(ReplicaMessage { from, body: Bytes::copy_from_slice(body) });
                }
                continue;
            }
            if message.get_channel_name() == ANNOUNCEMENTS {
                let payload = message.get_payload_bytes();
                let mut parts = payload.splitn(2, |b| *b == SEP as u8);
                if let (Some(from), Some(announcement)) = (parts.next(), parts.next())
                    && from != owner.as_bytes()
                {
                    let _ = announcements.send(Bytes::copy_from_slice(announcement));
                }
                continue;
            }
            if message.get_channel_name() == TASK_CHANGES {
                if let Ok(id) = message.get_payload::<String>()
                    && let Ok(id) = TaskId::parse(&id)
                {
                    let _ = task_changes.send(id);
                }
                continue;
            }
            if message.get_channel_name() == ANSWERS {
                let payload = message.get_payload_bytes();
                let mut parts = payload.splitn(3, |b| *b == SEP as u8);
                if let (Some(session), Some(id), Some(response)) = (parts.next(), parts.next(), parts.next())
                    && let Ok(session) = SessionId::parse(&String::from_utf8_lossy(session))
                {
                    let _ = answers.send(RelayedAnswer {
                        session,
                        request_id: String::from_utf8_lossy(id).into_owned(),
                        response: Bytes::copy_from_slice(response),
                    });
                }
                continue;
            }
            let Ok(payload) = message.get_payload::<String>() else { continue };
            let mut parts = payload.split(SEP);
            let (Some(session), Some(stream), Some(seq)) = (parts.next(), parts.next(), parts.next()) else { continue };
            let (Ok(stream), Ok(seq)) = (StreamName::parse(stream), seq.parse::<u64>()) else { continue };
            heads.notify(session, &stream, seq);
        }
        tracing::warn!("redis subscription lost; resubscribing");
        pubsub = loop {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            match subscribe(&client, &owner).await {
                Ok(pubsub) => break pubsub,
                Err(err) => tracing::warn!(%err, "redis resubscribe failed"),
            }
        };
        heads.wake_all();
    }
}
