//! Accepting connections: a bounded number open at once, a deadline on every request's
//! headers (idle keep-alive and h2 connections included), optional TLS, and a graceful
//! stop that lets open responses finish.
//!
//! `axum::serve` has none of the first three: 2,000 idle or half-sent connections stayed
//! open indefinitely (#20, item 7). Bodies have their own deadline (`read_body`).

use crate::http::tls::TlsCertificates;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// How connections are accepted and bounded.
#[derive(Clone)]
pub(crate) struct ServeOptions {
    /// Longest wait for a request's headers, counted from when the connection is ready
    /// for the next request (so it also closes idle keep-alive connections) and for the
    /// TLS handshake.
    pub header_read_timeout: Duration,
    /// Most connections open at once; past it the listener stops accepting until one
    /// closes (new clients wait in the kernel's backlog). 0: no limit.
    pub max_connections: usize,
    /// Serve HTTPS with these certificates instead of plain HTTP.
    pub tls: Option<Arc<TlsCertificates>>,
    /// Connections open now (the gateway's `/metrics` reads it).
    pub open: Arc<AtomicUsize>,
}

/// Serves `router` on `listener` until `stop` turns true, then lets open connections
/// finish their responses (callers bound that wait).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    opts: ServeOptions,
    stop: watch::Receiver<bool>,
) {
    let limit = (opts.max_connections > 0).then(|| Arc::new(Semaphore::new(opts.max_connections)));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let mut connections = JoinSet::new();
    let mut warned_full = false;
    loop {
        let permit = match &limit {
            Some(limit) => {
                if limit.available_permits() == 0 && !warned_full {
                    tracing::warn!(
                        "{} connections open (--max-connections): not accepting until one closes",
                        opts.max_connections
                    );
                    warned_full = true;
                }
                tokio::select! {
                    permit = limit.clone().acquire_owned() => match permit {
                        Ok(p) => Some(p),
                        Err(_) => break,
                    },
                    _ = stopped(stop.clone()) => break,
                }
            }
            None => None,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(stop.clone()) => break,
        };
        if limit.as_ref().is_some_and(|l| l.available_permits() > 0) {
            warned_full = false;
        }
        // Streamed tokens go out as small writes: without TCP_NODELAY each one after the
        // first waits for the client's delayed ACK (up to 40 ms on Linux).
        let _ = tcp.set_nodelay(true);
        let (builder, router, stop, opts) =
            (builder.clone(), router.clone(), stop.clone(), opts.clone());
        connections.spawn(async move {
            opts.open.fetch_add(1, Ordering::Relaxed);
            match &opts.tls {
                None => {
                    serve_connection(&builder, tcp, router, opts.header_read_timeout, stop).await
                }
                Some(tls) => {
                    let handshake = tls.acceptor().accept(tcp);
                    match tokio::time::timeout(opts.header_read_timeout, handshake).await {
                        Ok(Ok(stream)) => {
                            serve_connection(
                                &builder,
                                stream,
                                router,
                                opts.header_read_timeout,
                                stop,
                            )
                            .await
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake with {peer} failed: {e}"),
                        Err(_) => tracing::debug!("TLS handshake with {peer} timed out"),
                    }
                }
            }
            opts.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
        // Reap finished connections so the set does not grow with every one served.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

async fn serve_connection<IO>(
    builder: &auto::Builder<TokioExecutor>,
    io: IO,
    router: Router,
    header_read_timeout: Duration,
    stop: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // hyper's header deadline starts once it knows the protocol (reading the first bytes
    // to tell HTTP/1.1 from h2 has none) and HTTP/1.1 only: an h2 connection that served
    // one request could stay open with none. So a connection with no request in flight
    // for the header deadline is closed whatever its protocol.
    let (activity, mut watched) = watch::channel(Activity::default());
    let activity = Arc::new(activity);
    let service = tower::service_fn(move |req: axum::extract::Request<Incoming>| {
        let in_flight = InFlight::start(&activity);
        let router = router.clone();
        async move {
            let response = router.oneshot(req).await?;
            // The request counts until its response body is sent or dropped.
            Ok::<_, Infallible>(response.map(|body| {
                axum::body::Body::new(body.map_frame(move |frame| {
                    let _ = &in_flight;
                    frame
                }))
            }))
        }
    });
    let conn =
        builder.serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(service));
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!("connection ended: {e}");
            }
        }
        _ = idle_for(&mut watched, header_read_timeout) => {
            tracing::debug!("no request for the header deadline; closing");
            // h2 says GOAWAY and waits for its PING's acknowledgement, which a hostile
            // client never sends; streams opened meanwhile are still served. So the
            // connection is dropped only once it is idle for a further deadline.
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = idle_for(&mut watched, header_read_timeout) => {}
            }
        }
        _ = stopped(stop) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Requests on one connection: in flight now, and started so far.
#[derive(Debug, Default, Clone, Copy)]
struct Activity {
    in_flight: usize,
    started: u64,
}

/// One request in flight; counted out when dropped.
struct InFlight(Arc<watch::Sender<Activity>>);

impl InFlight {
    fn start(activity: &Arc<watch::Sender<Activity>>) -> Self {
        activity.send_modify(|a| {
            a.in_flight += 1;
            a.started += 1;
        });
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .send_modify(|a| a.in_flight = a.in_flight.saturating_sub(1));
    }
}

/// Resolves once the connection had no request in flight, and started none, for `limit`.
async fn idle_for(activity: &mut watch::Receiver<Activity>, limit: Duration) {
    loop {
        let since = match activity.wait_for(|a| a.in_flight == 0).await {
            Ok(a) => Some(a.started),
            Err(_) => None,
        };
        let Some(since) = since else {
            return std::future::pending().await;
        };
        let next = activity.wait_for(|a| a.started != since);
        if tokio::time::timeout(limit, next).await.is_err() {
            return;
        }
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
