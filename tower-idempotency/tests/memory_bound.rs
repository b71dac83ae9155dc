//! The in-memory store is bounded by bytes, not only by entries: 2,000
//! responses of 512 KiB through the guard (1000 MiB in all) into a store
//! allowed 64 MiB grow the process by less than 128 MiB.
//!
//! Its own test binary, with one test, so that nothing else allocates while
//! it measures the resident set (Linux `/proc/self/status`).

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency::store::MemoryIdempotencyStore;
use tower_idempotency::{GuardBody, IdempotencyGuardLayer};

const RECORDS: usize = 2_000;
const RESPONSE_BYTES: usize = 512 * 1024;
const MAX_BYTES: usize = 64 << 20;
const MAX_GROWTH: usize = 128 << 20;

/// The resident set size in bytes, where the platform tells.
fn resident_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[tokio::test(flavor = "current_thread")]
async fn two_thousand_large_responses_stay_within_max_bytes() {
    let Some(before) = resident_bytes() else {
        eprintln!("SKIPPED: no /proc/self/status on this platform to read the resident set from");
        return;
    };
    let store = MemoryIdempotencyStore::new(100_000).with_max_bytes(MAX_BYTES);
    let service = IdempotencyGuardLayer::new(store.clone()).layer(service_fn(
        |request: Request<GuardBody<Full<Bytes>>>| async move {
            let fill = request.uri().path().len() as u8;
            let body = Bytes::from(vec![fill; RESPONSE_BYTES]);
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(body)))
        },
    ));
    let mut peak = before;
    for n in 0..RECORDS {
        let request = Request::post(format!("/orders/{n}"))
            .header("idempotency-key", format!("k-{n}"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), RESPONSE_BYTES);
        assert!(store.bytes() <= MAX_BYTES, "{} bytes held", store.bytes());
        if n % 50 == 0 {
            peak = peak.max(resident_bytes().unwrap());
        }
    }
    let after = resident_bytes().unwrap();
    peak = peak.max(after);
    let kept = store.len();
    eprintln!(
        "{RECORDS} responses of {RESPONSE_BYTES} B: {kept} kept, {} B counted; resident set {} MiB -> {} MiB (peak {} MiB)",
        store.bytes(),
        before >> 20,
        after >> 20,
        peak >> 20
    );
    assert!(
        kept > 100 && kept < RECORDS,
        "the store evicted to its byte bound"
    );
    assert!(
        peak - before < MAX_GROWTH,
        "resident set grew by {} MiB",
        (peak - before) >> 20
    );
    // The newest responses are still replayed.
    let repeat = Request::post(format!("/orders/{}", RECORDS - 1))
        .header("idempotency-key", format!("k-{}", RECORDS - 1))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let repeat = service.oneshot(repeat).await.unwrap();
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
}
