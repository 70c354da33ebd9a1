//! An rmcp `#[tool]` server hosted by tether on the embedded store, called by an rmcp client on
//! tether's transport, through a proxy that cuts every SSE response after a few hundred bytes:
//! the call's progress reaches rmcp exactly once each and in order across the resumes, the tool
//! runs once, and ending the session stops the session's rmcp service. Also: a request from an
//! rmcp tool to the client reaches the rmcp client's handler through tether, and a 2026-07-28
//! request is served by an rmcp service of its own.

// Roots are deprecated only for 2026-07-28 (SEP-2577); the legacy revisions have them.
#![allow(deprecated)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, ListRootsResult, ProgressNotificationParam, Request,
    Root, ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use tether_client::rmcp::TetherTransport;
use tether_client::{Backoff, ClientConfig, ClientEvent, ResumeVerdict};
use tether_examples::rmcp_counter::{Counter, Stats};
use tether_gateway::rmcp::RmcpHandler;
use tether_server::{Builder, ServerConfig};
use tether_store::{Retention, SqliteStore};
use tether_testkit::proxy;

const STEPS: u32 = 60;

#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<f64>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(&self, params: ProgressNotificationParam, _: NotificationContext<RoleClient>) {
        self.progress.lock().expect("progress").push(params.progress);
    }

    async fn list_roots(&self, _: RequestContext<RoleClient>) -> Result<ListRootsResult, ErrorData> {
        Ok(ListRootsResult::new(vec![Root::new("file:///srv/a"), Root::new("file:///srv/b")]))
    }
}

/// A tether server hosting [`Counter`] on `store`, on a free loopback port.
async fn start_server(
    store: Arc<dyn tether_store::Store>,
    stats: &Arc<Stats>,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>) {
    let stats = Arc::clone(stats);
    let handler = RmcpHandler::new(move || Counter::new(Arc::clone(&stats)));
    let config = ServerConfig { sse_retry: Duration::from_millis(2), ..ServerConfig::default() };
    let app = Builder::new(handler).store(store).config(config).build().router("/mcp");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    (
        addr,
        tokio::spawn(
            async move { tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await },
        ),
    )
}

/// Waits up to 5 s for `condition`; fails with `what` if it never holds.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An rmcp client on tether's transport, initialized with the server at `addr`.
async fn rmcp_client(addr: std::net::SocketAddr) -> rmcp::service::RunningService<RoleClient, Recorder> {
    let (transport, _events) = TetherTransport::new(ClientConfig::new(format!("http://{addr}/mcp")));
    Recorder::default().serve(transport).await.expect("rmcp initializes through tether")
}

/// The text of a tool result.
fn text(result: ServerResult) -> String {
    let ServerResult::CallToolResult(result) = result else { panic!("not a tool result: {result:?}") };
    let content = serde_json::to_value(&result.content).expect("content");
    content[0]["text"].as_str().expect("text").to_owned()
}

/// tether's transport, recording the progress it hands to rmcp in the order it does (rmcp
/// runs each notification's handler in a task of its own, so the handler sees them in any order).
struct Recording {
    inner: TetherTransport,
    progress: Arc<Mutex<Vec<f64>>>,
}

impl Transport<RoleClient> for Recording {
    type Error = <TetherTransport as Transport<RoleClient>>::Error;

    fn send(&mut self, item: ClientJsonRpcMessage) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        let message = self.inner.receive().await?;
        let value = serde_json::to_value(&message).expect("serializable");
        if value["method"] == "notifications/progress" {
            self.progress.lock().expect("progress").push(value["params"]["progress"].as_f64().expect("progress"));
        }
        Some(message)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rmcp_tool_call_is_resumed_exactly_through_cut_streams() {
    let dir = std::env::temp_dir().join(format!("tether-rmcp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = SqliteStore::open(&dir, Retention::default(), "rmcp-test").expect("store");
    let stats = Arc::new(Stats::default());
    let (upstream, server) = start_server(Arc::new(store), &stats).await;
    let proxy = proxy::start(vec![upstream], 0x5eed, 300, 900).await;

    let mut config = ClientConfig::new(format!("http://{}/mcp", proxy.addr));
    config.backoff = Backoff {
        initial: Duration::from_millis(2),
        max: Duration::from_millis(20),
        max_attempts_without_progress: 50,
    };
    let (transport, mut events) = TetherTransport::new(config);
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let transport = Recording { inner: transport, progress: Arc::clone(&delivered) };
    let recorder = Recorder::default();
    let client = recorder.clone().serve(transport).await.expect("rmcp initializes through tether");
    assert_eq!(client.peer_info().map(|info| info.capabilities.tools.is_some()), Some(true));
    proxy.cutting.store(true, Ordering::Relaxed);

    let arguments = serde_json::json!({"to": STEPS, "interval_ms": 2});
    let params = CallToolRequestParams::new("count").with_arguments(arguments.as_object().cloned().expect("object"));
    let call = ClientRequest::CallToolRequest(Request::new(params));
    let handle = client.send_cancellable_request(call, PeerRequestOptions::no_options()).await.expect("sent");
    let result = tokio::time::timeout(Duration::from_secs(30), handle.await_response())
        .await
        .expect("the call ends within 30 s")
        .expect("the call succeeds");
    assert_eq!(text(result), "counted to 60");

    let cuts = proxy.cuts.load(Ordering::Relaxed);
    assert!(cuts >= 3, "the proxy cut the stream only {cuts} times");
    let expected: Vec<f64> = (1..=STEPS).map(f64::from).collect();
    let delivered = delivered.lock().expect("progress").clone();
    assert_eq!(delivered, expected, "every progress notification handed to rmcp exactly once, in order");
    // rmcp hands each notification to the handler in a task of its own: the last may still be
    // on its way when the response is.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while recorder.progress.lock().expect("progress").len() < expected.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut handled = recorder.progress.lock().expect("progress").clone();
    handled.sort_by(f64::total_cmp);
    assert_eq!(handled, expected, "rmcp's handler saw each progress notification once");
    assert_eq!(stats.runs.load(Ordering::SeqCst), 1, "the tool ran once");
    let mut continuous = 0;
    while let Ok(event) = events.try_recv() {
        match event {
            ClientEvent::Resumed { verdict: ResumeVerdict::Continuous, .. } => continuous += 1,
            ClientEvent::Divergence { reason } => panic!("divergence {}: {reason}", reason.kind()),
            _ => {}
        }
    }
    assert!(continuous >= 1, "no resume was reported");

    // One rmcp service for the session; ending the session (rmcp's close → DELETE) stops it.
    assert_eq!(stats.live.load(Ordering::SeqCst), 1);
    proxy.cutting.store(false, Ordering::Relaxed);
    client.cancel().await.expect("rmcp closes");
    eventually("the session's rmcp service outlived the session", || stats.live.load(Ordering::SeqCst) == 0).await;
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_notifications_between_the_rmcp_ends_pass_through_tether() {
    let stats = Arc::new(Stats::default());
    let store = Arc::new(tether_store::MemoryStore::new(Retention::default()));
    let (addr, server) = start_server(store, &stats).await;
    let client = rmcp_client(addr).await;
    let call = ClientRequest::CallToolRequest(Request::new(CallToolRequestParams::new("roots")));
    let result = tokio::time::timeout(Duration::from_secs(10), client.send_request(call))
        .await
        .expect("the call ends within 10 s")
        .expect("the call succeeds");
    assert_eq!(text(result), "file:///srv/a file:///srv/b");
    // And the client's notification reaches the session's rmcp service.
    client.notify_roots_list_changed().await.expect("notified");
    eventually("the rmcp service never heard of the change", || stats.roots_changed.load(Ordering::SeqCst) == 1).await;
    client.cancel().await.expect("rmcp closes");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_07_28_request_is_served_by_an_rmcp_service_kept_for_its_client() {
    let stats = Arc::new(Stats::default());
    let store = Arc::new(tether_store::MemoryStore::new(Retention::default()));
    let (addr, server) = start_server(store, &stats).await;
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "count", "arguments": {"to": 3},
        "_meta": {"progressToken": "p", "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}});
    let http = tether_client::tls::Trust::platform().http_client().build().expect("client");
    for run in 1..=2 {
        let response = http
            .post(format!("http://{addr}/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "count")
            .body(body.to_string())
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), 200);
        assert!(response.headers().get("mcp-session-id").is_none());
        let text = response.text().await.expect("body");
        let progress: Vec<&str> = text.lines().filter(|line| line.contains("notifications/progress")).collect();
        assert_eq!(progress.len(), 3, "{text}");
        assert!(text.contains("counted to 3"), "{text}");
        assert_eq!(stats.runs.load(Ordering::SeqCst), run);
        // One service, kept idle between the requests of one client.
        assert_eq!(stats.live.load(Ordering::SeqCst), 1, "run {run}");
    }
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rmcp_client_s_cancellation_stops_the_rmcp_tool_on_the_server() {
    let stats = Arc::new(Stats::default());
    let store = Arc::new(tether_store::MemoryStore::new(Retention::default()));
    let (addr, server) = start_server(store, &stats).await;
    let client = rmcp_client(addr).await;
    let arguments = serde_json::json!({"to": 10_000, "interval_ms": 5});
    let params = CallToolRequestParams::new("count").with_arguments(arguments.as_object().cloned().expect("object"));
    let call = ClientRequest::CallToolRequest(Request::new(params));
    let handle = client.send_cancellable_request(call, PeerRequestOptions::no_options()).await.expect("sent");
    eventually("the tool never started", || stats.steps.load(Ordering::SeqCst) >= 5).await;
    handle.cancel(Some("enough".into())).await.expect("cancelled");
    // The tool stops: its step count settles well short of 10,000.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = stats.steps.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = stats.steps.load(Ordering::SeqCst);
        if now == last {
            break;
        }
        assert!(Instant::now() < deadline, "the tool kept running after the cancellation");
        last = now;
    }
    assert!(last < 1_000, "the tool ran {last} steps");
    assert_eq!(stats.runs.load(Ordering::SeqCst), 1);
    client.cancel().await.expect("rmcp closes");
    server.abort();
}
