//! A request body dropped unread over HTTP/2 while its stream is still
//! open — a refusal not yet written out, a handler that ignores the body —
//! and the body's small DATA frames arriving after the drop: with a
//! `DrainLayer` the connection lives on; without one, h2 charges every such
//! frame to the connection's flood budget for good and closes the
//! connection with `GOAWAY ENHANCE_YOUR_CALM`. A raw h2 client sends the
//! frames only once the server has dropped the body, so the interleaving
//! is caused, not hoped for.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tollgate_tower::DrainLayer;
use tower::{ServiceBuilder, service_fn};

/// The server's stream window, in bytes: a client sends at most this much
/// on a stream before the server reads it (one-byte frames: as many frames).
const WINDOW: u32 = 256;
/// Streams: each leaks `WINDOW` frames of 255 charged bytes when its body
/// is dropped unread, and h2's budget is half hyper's 1 MiB connection
/// window: 9 streams exhaust it.
const STREAMS: usize = 12;

/// Drops the request's body at once, says so through `dropped`, and answers
/// only after `release`: the stream stays open meanwhile.
fn handler<B: Send + 'static>(
    dropped: Arc<Notify>,
    release: Arc<Notify>,
) -> impl tower::Service<
    Request<B>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |request: Request<B>| {
        let (dropped, release) = (dropped.clone(), release.clone());
        async move {
            drop(request);
            dropped.notify_one();
            release.notified().await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    })
}

/// An HTTP/2 server of `handler`, behind a drain layer or not; `read`
/// counts the request data frames anyone read.
async fn server(
    drain: bool,
    dropped: Arc<Notify>,
    release: Arc<Notify>,
    read: Arc<AtomicUsize>,
) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder.initial_stream_window_size(WINDOW);
        let io = TokioIo::new(stream);
        if drain {
            let service = ServiceBuilder::new()
                .map_request(move |request: Request<Incoming>| {
                    let read = read.clone();
                    // Counts the data frames read from the body.
                    request.map(|body| {
                        body.map_frame(move |frame| {
                            if frame.is_data() {
                                read.fetch_add(1, Ordering::SeqCst);
                            }
                            frame
                        })
                    })
                })
                .layer(DrainLayer::new())
                .service(handler(dropped, release));
            let _ = builder
                .serve_connection(io, TowerToHyperService::new(service))
                .await;
        } else {
            let _ = builder
                .serve_connection(io, TowerToHyperService::new(handler(dropped, release)))
                .await;
        }
    });
    addr
}

/// `STREAMS` times: opens a request, waits until the server dropped its
/// body, sends the body as `WINDOW` one-byte DATA frames (all the stream's
/// window lets it send unread), ends it, and waits up to `wait` for the
/// server to have read them before the next. Returns how the
/// connection ended, `None` if it is still open.
async fn drop_then_send_the_bodies(drain: bool, wait: Duration) -> Option<Result<(), h2::Error>> {
    let (dropped, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let read = Arc::new(AtomicUsize::new(0));
    let addr = server(drain, dropped.clone(), release.clone(), read.clone()).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    let (ended_tx, mut ended) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = ended_tx.send(connection.await);
    });
    let mut answers = Vec::new();
    for stream in 1..=STREAMS {
        let Ok(ready) = client.ready().await else {
            break;
        };
        client = ready;
        let Ok((response, mut body)) =
            client.send_request(Request::post("http://x/upload").body(()).unwrap(), false)
        else {
            break;
        };
        answers.push(response);
        dropped.notified().await;
        for _ in 0..WINDOW {
            if body.send_data(Bytes::from_static(&[7]), false).is_err() {
                break;
            }
        }
        let _ = body.send_data(Bytes::new(), true);
        let all_read = async {
            while read.load(Ordering::SeqCst) < stream * WINDOW as usize {
                tokio::task::yield_now().await;
            }
        };
        let _ = tokio::time::timeout(wait, all_read).await;
        if let Ok(end) = ended.try_recv() {
            return Some(end);
        }
    }
    release.notify_waiters();
    for _ in 0..STREAMS {
        release.notify_one();
    }
    match tokio::time::timeout(Duration::from_millis(200), &mut ended).await {
        Ok(end) => Some(end.unwrap()),
        Err(_) => {
            // Alive: every answer arrives.
            for response in answers {
                assert_eq!(response.await.unwrap().status(), StatusCode::OK);
            }
            None
        }
    }
}

/// With the drain layer every stream's frames are read (the test waits for
/// it before the next stream) and the connection outlives them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_body_keeps_the_connection() {
    let ended = drop_then_send_the_bodies(true, Duration::from_secs(20)).await;
    assert!(ended.is_none(), "the connection ended: {ended:?}");
}

/// The known-bad: the same without the drain layer loses the connection to
/// h2's flood protection (nothing reads the frames: each stream waits half
/// a second for it). (If an h2 release stops charging the frames of a
/// dropped body, this fails, and the drain layer is no longer needed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_drain_layer_h2_closes_the_connection() {
    let ended = drop_then_send_the_bodies(false, Duration::from_millis(500)).await;
    let error = ended.expect("still open").unwrap_err();
    // The GOAWAY, or the closed socket under a client still writing.
    if error.is_go_away() {
        assert_eq!(error.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM));
    } else {
        assert!(error.is_io(), "{error:?}");
    }
}
