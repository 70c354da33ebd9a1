//! The user agent of the authorization code flow: what takes the authorization request to the
//! authorization server and brings back where it redirected.

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::AuthError;

/// The redirect an authorization ended in, as the future of [`UserAgent::authorize`].
pub type Redirected<'a> = Pin<Box<dyn Future<Output = Result<String, AuthError>> + Send + 'a>>;

/// Takes an authorization request to the authorization server: a person in a browser, or a
/// program where the server approves without one.
pub trait UserAgent: Send + Sync + std::fmt::Debug {
    /// Where the authorization server sends the person back (registered with the client).
    fn redirect_uri(&self) -> &str;

    /// Goes through the authorization at `url` and returns the URL redirected to, with its
    /// `code` (or `error`), `state` and `iss`.
    fn authorize<'a>(&'a self, url: &'a str) -> Redirected<'a>;
}

/// A user agent for authorization servers that approve without a person (a test's, the
/// conformance suite's): it requests the authorization URL and reads the redirect it answers.
#[derive(Debug)]
pub struct FollowRedirect {
    http: reqwest::Client,
    redirect_uri: String,
}

impl FollowRedirect {
    /// One that is sent back to `redirect_uri` (nothing need listen there: it is only read),
    /// trusting `trust` for https authorization servers.
    pub fn new(redirect_uri: impl Into<String>, trust: &crate::tls::Trust) -> Result<FollowRedirect, AuthError> {
        let http = trust
            .http_client()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|err| AuthError::Http(err.to_string()))?;
        Ok(FollowRedirect { http, redirect_uri: redirect_uri.into() })
    }
}

impl UserAgent for FollowRedirect {
    fn redirect_uri(&self) -> &str {
        &self.redirect_uri
    }

    fn authorize<'a>(&'a self, url: &'a str) -> Redirected<'a> {
        Box::pin(async move {
            let response = self.http.get(url).send().await.map_err(|err| AuthError::Http(err.to_string()))?;
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|value| value.to_str().ok())
                .filter(|_| response.status().is_redirection())
                .ok_or_else(|| {
                    AuthError::Denied(format!("the authorization request answered {}", response.status()))
                })?;
            Ok(location.to_owned())
        })
    }
}

/// The largest request head the loopback listener reads.
const MAX_REDIRECT_HEAD: usize = 16 * 1024;

/// A user agent for a person: the authorization URL is printed for them to open in a browser,
/// and the redirect comes back to a listener on a loopback port (RFC 8252 §7.3).
#[derive(Debug)]
pub struct LoopbackRedirect {
    listener: tokio::sync::Mutex<tokio::net::TcpListener>,
    redirect_uri: String,
    wait: std::time::Duration,
}

impl LoopbackRedirect {
    /// Listens on 127.0.0.1 at a free port; a person has `wait` to authorize. Call it within a
    /// Tokio runtime.
    pub fn bind(wait: std::time::Duration) -> Result<LoopbackRedirect, AuthError> {
        let failed = |err: std::io::Error| AuthError::Http(format!("no loopback port for the redirect: {err}"));
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(failed)?;
        listener.set_nonblocking(true).map_err(failed)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(failed)?;
        let port = listener.local_addr().map_err(failed)?.port();
        Ok(LoopbackRedirect {
            listener: tokio::sync::Mutex::new(listener),
            redirect_uri: format!("http://127.0.0.1:{port}/callback"),
            wait,
        })
    }

    /// The next request to the callback path, as a URL; other requests (a browser's favicon)
    /// are answered 404.
    async fn callback(&self) -> Result<String, AuthError> {
        let listener = self.listener.lock().await;
        loop {
            let (mut socket, _) = listener.accept().await.map_err(|err| AuthError::Http(err.to_string()))?;
            let mut head = Vec::new();
            let mut chunk = [0u8; 2048];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REDIRECT_HEAD {
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&chunk[..n]),
                }
            }
            let text = String::from_utf8_lossy(&head);
            let target = text.lines().next().and_then(|line| line.split(' ').nth(1)).unwrap_or("");
            if target.split('?').next() != Some("/callback") {
                let _ =
                    socket.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
                continue;
            }
            let page = "tether: authorization received; this window may be closed.";
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = socket.write_all(reply.as_bytes()).await;
            let base = self.redirect_uri.trim_end_matches("/callback");
            return Ok(format!("{base}{target}"));
        }
    }
}

impl UserAgent for LoopbackRedirect {
    fn redirect_uri(&self) -> &str {
        &self.redirect_uri
    }

    fn authorize<'a>(&'a self, url: &'a str) -> Redirected<'a> {
        Box::pin(async move {
            eprintln!("To authorize tether, open this URL in a browser:\n\n  {url}\n");
            tokio::time::timeout(self.wait, self.callback())
                .await
                .map_err(|_| AuthError::Denied(format!("no authorization came back within {:?}", self.wait)))?
        })
    }
}
