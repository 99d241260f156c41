//! Accepting connections: a bounded number open at once, a deadline on every request's
//! headers (idle keep-alive connections included), optional TLS, and a graceful stop
//! that lets open responses finish.
//!
//! `axum::serve` has none of the first three: 2,000 idle or half-sent connections stayed
//! open indefinitely (#20, item 7). Bodies have their own deadline (`read_body`).

use crate::tls::TlsCertificates;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// How connections are accepted and bounded.
#[derive(Clone)]
pub struct ServeOptions {
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
pub async fn serve(
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
    // hyper's header deadline starts once it knows the protocol; reading the first bytes
    // to tell HTTP/1.1 from h2 has none. So the first request must arrive in time too.
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    let router = router.map_request(move |req| {
        flag.store(true, Ordering::Relaxed);
        req
    });
    let service = TowerToHyperService::new(router);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let first_request = async {
        tokio::time::sleep(header_read_timeout).await;
        if started.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!("connection ended: {e}");
            }
        }
        _ = first_request => tracing::debug!("no request within the header deadline; closing"),
        _ = stopped(stop) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
