//! The deadline every request to the object store runs under (`--s3-timeout`, and what
//! an outage allows), and its failures in words (what a log line and a message say)
//! and as errnos (what the application gets).

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::store::operation;

pub(super) type ObjResult<T> = Result<T, object_store::Error>;

/// No answer within `--s3-timeout`: what a request that outlived it fails with.
#[derive(Debug, thiserror::Error)]
#[error("timed out: no answer within {}s (--s3-timeout)", .0.as_secs_f64())]
pub(super) struct TimedOut(Duration);

/// `f`, failing with [`TimedOut`] (which names `limit`, the `--s3-timeout`) after
/// `allowed`: a stalled endpoint (an answer that never comes or never ends) holds no
/// request longer, whatever the client's own timeouts and retries do (issue 34: a
/// hanging request took 30 s with `--s3-timeout 3`). Nothing is sent when nothing is
/// allowed.
pub(super) async fn timed<T>(
    limit: Duration,
    allowed: Duration,
    f: impl Future<Output = ObjResult<T>>,
) -> ObjResult<T> {
    let timed_out = || object_store::Error::Generic {
        store: "S3",
        source: Box::new(TimedOut(limit)),
    };
    if allowed.is_zero() {
        return Err(timed_out());
    }
    match tokio::time::timeout(allowed, f).await {
        Ok(res) => res,
        Err(_) => Err(timed_out()),
    }
}

/// How long an operation may wait for the endpoint while it is known not to answer (a
/// request got no answer within the last `--s3-timeout`, and none has got one since):
/// the kernel asks again after a failed read (its read-ahead, then the page), and an
/// `open` asks a lookup and an open; each must not take the whole timeout again. An
/// endpoint that is back answers in far less, and ends the outage.
const OUTAGE_ALLOWANCE: Duration = Duration::from_secs(1);

/// How the requests of a store are timed: its limit (`--s3-timeout`), shared by all the
/// requests of an operation in a row ([`operation`]), and whether the endpoint is
/// answering.
#[derive(Clone)]
pub(super) struct Deadline {
    pub(super) limit: Duration,
    /// When a request last got no answer, if none has got one since.
    unanswered: Arc<Mutex<Option<Instant>>>,
}

impl Deadline {
    pub(super) fn new(limit: Duration) -> Self {
        Deadline {
            limit,
            unanswered: Arc::default(),
        }
    }

    /// Whether the endpoint is known not to answer now.
    pub(super) fn outage(&self) -> bool {
        self.unanswered
            .lock()
            .is_some_and(|at| at.elapsed() < self.limit)
    }

    /// How long a request may take now.
    pub(super) fn allowance(&self) -> Duration {
        let left = operation::allowance(self.limit);
        if self.outage() {
            left.min(OUTAGE_ALLOWANCE)
        } else {
            left
        }
    }

    /// What a request came to: an answer starts its operation's time again and ends an
    /// outage; no answer begins one.
    pub(super) fn note<T>(&self, res: &ObjResult<T>) {
        if answered(res) {
            operation::progressed();
            *self.unanswered.lock() = None;
        } else if matches!(res, Err(object_store::Error::Generic { .. })) {
            *self.unanswered.lock() = Some(Instant::now());
        }
    }

    /// `f` on the runtime behind `handle`, from a thread outside it, within
    /// [`Deadline::allowance`].
    pub(super) fn run<T>(
        &self,
        handle: &tokio::runtime::Handle,
        f: impl Future<Output = ObjResult<T>>,
    ) -> ObjResult<T> {
        let res = handle.block_on(timed(self.limit, self.allowance(), f));
        self.note(&res);
        res
    }
}

/// Whether the endpoint answered (what it answered may still be an error).
pub(super) fn answered<T, E: std::borrow::Borrow<object_store::Error>>(res: &Result<T, E>) -> bool {
    matches!(
        res.as_ref().map_err(|e| e.borrow()),
        Ok(_)
            | Err(object_store::Error::NotFound { .. }
                | object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. }
                | object_store::Error::NotModified { .. })
    )
}

/// A person's words for an object store failure at mount.
pub(super) fn describe_error(e: &object_store::Error) -> String {
    // The first line: the rest is the server's XML.
    let full = e.to_string();
    let text = full
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches(": ")
        .to_string();
    let lower = text.to_lowercase();
    // The causes too: a request the client gave up on says "error sending request",
    // and only its source says that it timed out.
    let causes: String = error_chain(e)
        .map(|c| c.to_string().to_lowercase() + "\n")
        .collect();
    match e {
        // Without credentials in the environment the client asks the EC2 instance
        // metadata service; off EC2 that fails in ways that read like something else.
        _ if full.contains("169.254.169.254") => format!(
            "no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set, and \
             the instance metadata service (169.254.169.254) gave none ({text})"
        ),
        // The credentials chain found none (aws.rs): it says where it looked.
        _ if let Some(said) = cause_saying(e, "no credentials:") => said,
        object_store::Error::NotFound { .. } => format!("no such bucket ({text})"),
        object_store::Error::PermissionDenied { .. } => format!("access denied (403): {text}"),
        object_store::Error::Unauthenticated { .. } => {
            format!("the credentials were refused: {text}")
        }
        // Ours ([`TimedOut`]), or the client's own: a timeout says timeout.
        _ if causes.contains("timed out") => {
            format!("the endpoint did not answer in time: {text}")
        }
        _ if full.contains("NoSuchBucket") || lower.contains("bucket does not exist") => {
            format!("no such bucket ({text})")
        }
        // A status 403, not any "403" (a key, a byte count, a duration in the text).
        _ if lower.contains("accessdenied")
            || lower.contains("status 403")
            || lower.contains("403 forbidden") =>
        {
            format!("access denied (403): {text}")
        }
        _ if lower.contains("connect")
            || lower.contains("error sending request")
            || lower.contains("dns") =>
        {
            format!("cannot reach the endpoint: {text}")
        }
        _ if lower.contains("credential") => format!("no usable credentials: {text}"),
        _ => text,
    }
}

/// The first of `e` and its causes whose words start with `start`.
fn cause_saying(e: &object_store::Error, start: &str) -> Option<String> {
    error_chain(e)
        .map(|c| c.to_string())
        .find(|said| said.starts_with(start))
}

/// `e` and its causes, outermost first.
pub(super) fn error_chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |c| c.source())
}

/// An object store error as an errno, logged with its words (FUSE carries only the
/// errno).
pub(super) fn to_io(rel: &Path, e: object_store::Error) -> io::Error {
    let errno = match &e {
        object_store::Error::NotFound { .. } => libc::ENOENT,
        object_store::Error::AlreadyExists { .. } => libc::EEXIST,
        object_store::Error::Precondition { .. } => libc::ESTALE,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => libc::EACCES,
        object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. } => {
            libc::ENOTSUP
        }
        _ => libc::EIO,
    };
    if errno != libc::ENOENT {
        log::warn!("{}: {}", rel.display(), describe_error(&e));
    }
    io::Error::from_raw_os_error(errno)
}
