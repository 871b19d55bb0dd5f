//! Request bodies that a service drops unread, read to their end in the
//! background.
//!
//! A limiter answers a refused or shed request without reading its body. On
//! HTTP/2 that is not free: h2 (0.4.19 and later) charges each small DATA
//! frame to a per-connection budget against framing floods, and releases the
//! charge when the application reads the frame. Frames that arrive after
//! the body was dropped are never read, so their charge is never released;
//! a connection that sees a hundred or so such frames (a client whose calls
//! are shed under load, each carrying a small message) is closed with
//! `GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"`, failing every call in
//! flight on it. Reading the dropped body to its end releases the charges.
//!
//! [`DrainLayer`] wraps each request body in a [`Drained`] body: read as
//! usual, it is the body it wraps; dropped before its end, it hands what is
//! left to a tokio task that reads and discards it, at most
//! [`DrainLayer::max_bytes`] and [`DrainLayer::timeout`], then drops it.
//! Put it outside the layers that refuse.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use tower_layer::Layer;
use tower_service::Service;

/// What the background read of a dropped body may take.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_bytes: u64,
    timeout: Duration,
}

/// A layer that reads the request bodies the services inside drop unread:
/// see the [module docs](self).
///
/// ```
/// use tollgate_tower::DrainLayer;
/// use std::time::Duration;
///
/// let drain = DrainLayer::new().max_bytes(64 * 1024).timeout(Duration::from_millis(500));
/// # let _ = drain;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct DrainLayer {
    limits: Limits,
}

impl Default for DrainLayer {
    fn default() -> Self {
        DrainLayer {
            limits: Limits {
                max_bytes: 1 << 20,
                timeout: Duration::from_secs(1),
            },
        }
    }
}

impl DrainLayer {
    /// Reads at most 1 MiB of a dropped body, for at most 1 s.
    ///
    /// ```
    /// let drain = tollgate_tower::DrainLayer::new();
    /// # let _ = drain;
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// The most a dropped body's background read takes before it gives up
    /// and drops the rest (h2 then resets the stream).
    ///
    /// ```
    /// let drain = tollgate_tower::DrainLayer::new().max_bytes(4096);
    /// # let _ = drain;
    /// ```
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.limits.max_bytes = max_bytes;
        self
    }

    /// The longest a dropped body's background read waits for the rest.
    ///
    /// ```
    /// let drain = tollgate_tower::DrainLayer::new().timeout(std::time::Duration::from_millis(200));
    /// # let _ = drain;
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.limits.timeout = timeout;
        self
    }

    /// Wraps one body as this layer does: for stacks whose inner services
    /// need their own body type (tonic's), re-box the result.
    ///
    /// ```
    /// use http_body_util::Full;
    /// let body = tollgate_tower::DrainLayer::new().wrap(Full::new(bytes::Bytes::from("hi")));
    /// # let _ = body;
    /// ```
    pub fn wrap<B>(&self, body: B) -> Drained<B>
    where
        B: Body + Unpin + Send + 'static,
        B::Data: Send,
    {
        Drained {
            inner: Some(body),
            limits: self.limits,
        }
    }
}

impl<S> Layer<S> for DrainLayer {
    type Service = Drain<S>;

    fn layer(&self, inner: S) -> Drain<S> {
        Drain {
            inner,
            layer: *self,
        }
    }
}

/// The service of a [`DrainLayer`].
#[derive(Debug, Clone)]
pub struct Drain<S> {
    inner: S,
    layer: DrainLayer,
}

impl<S, B> Service<Request<B>> for Drain<S>
where
    S: Service<Request<Drained<B>>>,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> S::Future {
        let layer = self.layer;
        self.inner.call(request.map(|body| layer.wrap(body)))
    }
}

/// A request body that, dropped before its end, is read to its end by a
/// background task: see the [module docs](self).
#[derive(Debug)]
pub struct Drained<B>
where
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
{
    /// `None` only while dropping.
    inner: Option<B>,
    limits: Limits,
}

impl<B> Body for Drained<B>
where
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl<B> Drop for Drained<B>
where
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
{
    fn drop(&mut self) {
        let Some(body) = self.inner.take() else {
            return;
        };
        if body.is_end_stream() {
            return;
        }
        // Outside a tokio runtime there is nowhere to read it: dropped.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain(body, self.limits));
        }
    }
}

/// Reads `body` to its end, or until `limits` stop it, discarding it.
async fn drain<B: Body + Unpin>(mut body: B, limits: Limits) {
    let mut left = limits.max_bytes;
    let read = async {
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            let Ok(frame) = frame else { return };
            if let Some(data) = frame.data_ref() {
                let n = data.remaining() as u64;
                if n > left {
                    return;
                }
                left -= n;
            }
        }
    };
    let _ = tokio::time::timeout(limits.timeout, read).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A body fed by a channel, counting the frames read from it.
    struct Fed {
        rx: tokio::sync::mpsc::Receiver<Bytes>,
        read: Arc<AtomicUsize>,
    }

    impl Body for Fed {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.rx.poll_recv(cx).map(|data| {
                data.map(|d| {
                    self.read.fetch_add(1, Ordering::SeqCst);
                    Ok(Frame::data(d))
                })
            })
        }
    }

    fn fed() -> (tokio::sync::mpsc::Sender<Bytes>, Fed, Arc<AtomicUsize>) {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let read = Arc::new(AtomicUsize::new(0));
        (
            tx,
            Fed {
                rx,
                read: read.clone(),
            },
            read,
        )
    }

    /// Frames sent after the body was dropped are read by the background
    /// task, up to the end of the body.
    #[tokio::test]
    async fn a_dropped_body_is_read_to_its_end() {
        let (tx, body, read) = fed();
        drop(DrainLayer::new().wrap(body));
        for _ in 0..3 {
            tx.send(Bytes::from_static(b"late")).await.unwrap();
        }
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), async {
            while read.load(Ordering::SeqCst) < 3 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the dropped body was not read");
    }

    /// The background read stops at `max_bytes`: a frame past it is left.
    #[tokio::test]
    async fn the_read_stops_at_max_bytes() {
        let (tx, body, read) = fed();
        drop(DrainLayer::new().max_bytes(8).wrap(body));
        for _ in 0..3 {
            tx.send(Bytes::from_static(b"12345")).await.unwrap();
        }
        // The task reads the first (5 bytes), reads the second (10 > 8) and
        // stops: the channel closes when it drops the body.
        tx.closed().await;
        assert_eq!(read.load(Ordering::SeqCst), 2);
    }

    /// A body read to its end while in use spawns nothing (outside a
    /// runtime, dropping an unfinished one does nothing).
    #[test]
    fn outside_a_runtime_a_dropped_body_is_just_dropped() {
        let (tx, body, _) = fed();
        drop(DrainLayer::new().wrap(body));
        assert!(tx.is_closed());
    }
}
