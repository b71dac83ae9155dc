//! A tonic gRPC client `Channel` wrapped in a circuit breaker and retry,
//! configured by a gRPC service config JSON file (gRFC A6,
//! `greeter_service_config.json` next to this file): `ServiceConfigLayer`
//! gives each call its method's retry policy (or hedging policy) by path.
//!
//! ```sh
//! cargo run -p examples --example tonic_client
//! ```
//!
//! A Greeter server runs in this process on 127.0.0.1. It answers
//! `UNAVAILABLE` to its first two calls (a server still warming up), then
//! works; later it goes down for good. The client sees:
//!
//! 1. a call that succeeds on its third attempt: the retry layer hid the blip;
//! 2. an `INVALID_ARGUMENT` that is *not* retried (it will never succeed);
//! 3. a bidirectional streaming `Chat` whose first attempt the server
//!    refuses (`UNAVAILABLE`): the retry replays the names already sent and
//!    carries on with the live stream, and the client sends each name only
//!    after the reply to the previous one came back (nothing is read ahead);
//! 4. during the outage, two calls that fail after their retries, after which
//!    the breaker opens and the next call fails at once without reaching the
//!    server.
//!
//! The stack, outermost first:
//!
//! ```text
//! GrpcStatus → CircuitBreaker → ReplayBody → ServiceConfigLayer (Retry per method) → Channel
//! ```
//!
//! # Why retry *below* the generated client, on the `Channel`
//!
//! There are two places a tower layer can wrap a tonic client:
//!
//! - **Around the `Channel`** (what this example does): the generated
//!   `GreeterClient` takes any `GrpcService`, so it takes our stack. The
//!   layers see `http::Request<tonic::body::Body>` and
//!   `http::Response<tonic::body::Body>`: `GrpcClassifier` reads `grpc-status`
//!   (and `grpc-retry-pushback-ms`) from the response, one stack serves every
//!   method of every client built on it, and the breaker guards the whole
//!   connection.
//! - Around a closure calling the generated client, with the request message
//!   as the request type. That works for one method at a time and needs a
//!   classifier over `tonic::Status`; it is simpler only when you want to
//!   retry a single call.
//!
//! Below the client, a request's body is the encoded messages as a stream that
//! can be read once. The retry layer must send it again, so `ReplayBodyLayer`
//! wraps it in a `ReplayBody`: each message goes to the server as the client
//! sends it and is recorded on the way (up to 64 KiB; a longer stream is sent
//! once and not retried, never truncated). A retry replays the recording,
//! then continues the live stream. A `map_request` under the retry layer
//! turns the body back into the `tonic::body::Body` the `Channel` takes.
//!
//! The retry layer decides on the response *head*, as gRPC's own retry does
//! (gRFC A6: once the server has started a response, the call is committed).
//! A status that arrives in the trailers of a started stream goes back to
//! the caller as it is.
//!
//! Every gRPC call is an HTTP POST, which the HTTP replay rules never retry by
//! default. gRPC decides per *method* whether a call is safe to repeat (its own
//! retry policy is configured per method, too): a method the service config
//! gives a `retryPolicy` is declared safe to repeat, and the builder the
//! config makes opts in (`retry_non_idempotent(true)`). Give a method whose
//! calls create things no retry policy, or put the stack on a client per
//! method.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status, Streaming};
use tower::{BoxError, ServiceBuilder};
use tower_breaker::answer::HttpError;
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, State};
use tower_classify::status::GrpcStatusLayer;
use tower_classify::GrpcClassifier;
use tower_retry_budget::body::{ReplayBody, ReplayBodyLayer};
use tower_retry_budget::service_config::ServiceConfig;

/// The code `build.rs` generated from `proto/greeter.proto`.
pub mod greeter {
    tonic::include_proto!("greeter");
}

use greeter::greeter_client::GreeterClient;
use greeter::greeter_server::{Greeter, GreeterServer};
use greeter::{HelloReply, HelloRequest};

/// A Greeter that fails its first `warm_up` calls with `UNAVAILABLE`, and every
/// call while `down` is set.
#[derive(Debug, Default)]
struct FlakyGreeter {
    calls: AtomicU32,
    warm_up: u32,
    down: AtomicBool,
    /// The `grpc-previous-rpc-attempts` header of every call, as received.
    previous_attempts: Mutex<Vec<Option<String>>>,
    /// `Chat` calls so far; the first is refused.
    chats: AtomicU32,
}

/// The replies of a `Chat` call.
type ChatStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<HelloReply, Status>> + Send>>;

#[tonic::async_trait]
impl Greeter for FlakyGreeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let previous = request
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.previous_attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(previous);
        if call <= self.warm_up {
            return Err(Status::unavailable("warming up"));
        }
        if self.down.load(Ordering::SeqCst) {
            return Err(Status::unavailable("down for maintenance"));
        }
        let name = request.into_inner().name;
        if name.is_empty() {
            return Err(Status::invalid_argument("name must not be empty"));
        }
        Ok(Response::new(HelloReply {
            message: format!("hello, {name}"),
            served_by_call: call,
        }))
    }

    type ChatStream = ChatStream;

    async fn chat(
        &self,
        request: Request<Streaming<HelloRequest>>,
    ) -> Result<Response<ChatStream>, Status> {
        let call = self.chats.fetch_add(1, Ordering::SeqCst) + 1;
        if call == 1 {
            return Err(Status::unavailable("warming up"));
        }
        let names = request.into_inner();
        let replies = futures_util::StreamExt::map(names, move |name| {
            name.map(|name| HelloReply {
                message: format!("hello, {}", name.name),
                served_by_call: call,
            })
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

/// The client type: the generated client over our stack. Naming it is rarely
/// needed (`GreeterClient::new(stack)` infers it); `impl GrpcService` hides it
/// in a function signature.
type Client = GreeterClient<
    tower::util::BoxCloneSyncService<
        http::Request<tonic::body::Body>,
        http::Response<tonic::body::Body>,
        std::convert::Infallible,
    >,
>;

/// Wraps `channel` in the breaker and the retry layer.
fn resilient_client(channel: Channel) -> Result<(Client, BreakerHandle), BoxError> {
    // One classifier for both layers, so they agree on what a failure is:
    // UNAVAILABLE, UNKNOWN, INTERNAL, DATA_LOSS → server error,
    // RESOURCE_EXHAUSTED → rate limited, DEADLINE_EXCEEDED → timeout (all
    // retried and counted by the breaker); INVALID_ARGUMENT, NOT_FOUND, … →
    // rejected (never retried, never trip the breaker).
    let classifier = GrpcClassifier::new();

    // The retry policy is the gRPC service config's (gRFC A6), as a gRPC
    // client in another language would read it: `greeter.Greeter`'s methods
    // get 4 attempts with exponential backoff (20 ms, ×2, at most 1 s,
    // ±20 %), retry UNAVAILABLE and RESOURCE_EXHAUSTED only, honour the
    // server's `grpc-retry-pushback-ms`, send `grpc-previous-rpc-attempts`,
    // end by the method's 2 s `timeout`, and stop retrying while the
    // throttle's tokens are at half or less. gRPC calls are POSTs: a method
    // with a retry policy is declared safe to repeat (see the top).
    // One layer applies the whole config: each call's path
    // (`/greeter.Greeter/SayHello`) picks its method config, and every
    // method shares the server's throttle.
    let service_config = ServiceConfig::from_json(include_str!("greeter_service_config.json"))?;
    let retry = service_config.layer(service_config.retry_throttle())?;

    // The breaker is *outside* the retry loop: it counts calls that still
    // failed after their retries, and once open it saves each caller the whole
    // loop (4 attempts and 3 sleeps), not one attempt. It opens after 2 such
    // calls here so the example is short (the default is 5); it stays open
    // 30 s, a fixed period (the default backs off from 250 ms to 500 ms), before it
    // lets a probe through. `HttpError` has the classifier judge a call
    // where its response body ends, from the trailers' `grpc-status`: a
    // server streaming replies answers `200` first.
    let breaker = CircuitBreakerLayer::builder()
        .name("greeter")
        .policy(Policy::consecutive_failures(2))
        .recovery_timeout(Duration::from_secs(30))
        .build(classifier)?
        .answer(HttpError);
    let handle = breaker.handle();

    let stack = ServiceBuilder::new()
        // tonic turns a service error it does not know into `UNKNOWN`. This
        // answers our layers' errors with the gRPC status each calls for (an
        // open circuit is `UNAVAILABLE` with `grpc-retry-pushback-ms`, a
        // retry loop out of time `DEADLINE_EXCEEDED`), as a server would.
        .layer(GrpcStatusLayer::new())
        // The body the breaker watches, back in tonic's body type.
        .map_response(|response: http::Response<_>| response.map(tonic::body::Body::new))
        .layer(breaker)
        // Records the encoded request stream (up to 64 KiB) as it is sent, so
        // it can be sent again; nothing is read ahead.
        .layer(ReplayBodyLayer::new(64 * 1024))
        // Each layer boxes tonic's transport error before classifying it,
        // so the `Channel` goes in as it is.
        .layer(retry)
        // Back to the body type the `Channel` takes.
        .map_request(|request: http::Request<ReplayBody<tonic::body::Body>>| {
            request.map(tonic::body::Body::new)
        })
        .service(channel);
    let stack = tower::util::BoxCloneSyncService::new(stack);
    Ok((GreeterClient::new(stack), handle))
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

async fn say_hello(client: &mut Client, name: &str) -> Result<HelloReply, Status> {
    let request = HelloRequest {
        name: name.to_owned(),
    };
    client.say_hello(request).await.map(Response::into_inner)
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    // The server, on a free port of 127.0.0.1.
    let greeter = Arc::new(FlakyGreeter {
        warm_up: 2,
        ..FlakyGreeter::default()
    });
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .add_service(GreeterServer::from_arc(greeter.clone()))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );

    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let (mut client, breaker) = resilient_client(channel)?;
    let calls = || greeter.calls.load(Ordering::SeqCst);
    let mut ok = true;
    let mut check = |what: &str, good: bool| {
        if !good {
            eprintln!("UNEXPECTED: {what}");
            ok = false;
        }
    };

    println!("gRPC server on {addr}: UNAVAILABLE for its first 2 calls, then up\n");

    // 1. A blip: the retry layer hides it.
    let started = Instant::now();
    let reply = say_hello(&mut client, "ada").await;
    let attempts = calls();
    match &reply {
        Ok(reply) => println!(
            "1. SayHello(ada) → OK {:?} after {attempts} attempts in {} (server call #{})",
            reply.message,
            ms(started.elapsed()),
            reply.served_by_call
        ),
        Err(status) => println!(
            "1. SayHello(ada) → {:?}: {}",
            status.code(),
            status.message()
        ),
    }
    let headers = greeter
        .previous_attempts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    println!("   grpc-previous-rpc-attempts seen by the server: {headers:?}");
    check("the first call succeeds after retries", reply.is_ok());
    check("three attempts reached the server", attempts == 3);
    check(
        "retries are marked with grpc-previous-rpc-attempts",
        headers == [None, Some("1".into()), Some("2".into())],
    );

    // 2. A permanent error: retrying it would only repeat it.
    let before = calls();
    let reply = say_hello(&mut client, "").await;
    let code = reply.as_ref().err().map(Status::code);
    println!(
        "2. SayHello(\"\") → {:?} after {} attempt (INVALID_ARGUMENT is rejected: not retried, not counted by the breaker)",
        code.unwrap_or(Code::Ok),
        calls() - before
    );
    check(
        "INVALID_ARGUMENT is not retried",
        code == Some(Code::InvalidArgument) && calls() - before == 1,
    );

    // 3. A bidirectional stream, refused once: retried, and still streaming.
    let (names, outbox) = tokio::sync::mpsc::channel::<HelloRequest>(1);
    let outbox = futures_util::stream::unfold(outbox, |mut outbox| async move {
        outbox.recv().await.map(|name| (name, outbox))
    });
    names
        .send(HelloRequest {
            name: "alan".into(),
        })
        .await?;
    let mut replies = client.chat(outbox).await?.into_inner();
    let mut chat = Vec::new();
    for next in ["barbara", "edsger", ""] {
        // The next name goes out only once the previous reply is back: a
        // layer that read the request stream ahead would wait here for ever.
        let reply = tokio::time::timeout(Duration::from_secs(5), replies.message())
            .await
            .map_err(|_| "no reply to a streamed name: the stream was held back")??;
        let Some(reply) = reply else { break };
        chat.push((reply.message, reply.served_by_call));
        if next.is_empty() {
            break;
        }
        names.send(HelloRequest { name: next.into() }).await?;
    }
    drop(names);
    let chats = greeter.chats.load(Ordering::SeqCst);
    println!(
        "3. Chat(alan, barbara, edsger) → {:?} on attempt {chats}, one reply per name as it was sent",
        chat.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>()
    );
    check(
        "the refused chat is retried and each name answered as it streams",
        chats == 2
            && chat
                == [
                    ("hello, alan".to_owned(), 2),
                    ("hello, barbara".to_owned(), 2),
                    ("hello, edsger".to_owned(), 2),
                ],
    );

    // 4. An outage: each call fails after its retries; the breaker counts
    //    those calls and opens after two of them.
    greeter.down.store(true, Ordering::SeqCst);
    println!("\n   -- the server goes down: every call now answers UNAVAILABLE --");
    for n in 4..=6 {
        let before = calls();
        let started = Instant::now();
        let reply = say_hello(&mut client, "grace").await;
        let reached = calls() - before;
        let state = breaker.list()[0].state;
        let code = reply.as_ref().err().map(Status::code);
        match reply {
            Ok(reply) => println!("{n}. SayHello(grace) → OK {:?}", reply.message),
            Err(status) => println!(
                "{n}. SayHello(grace) → {:?} \"{}\" in {}; {reached} attempt(s) reached the server; breaker now {state:?}",
                status.code(),
                status.message(),
                ms(started.elapsed()),
            ),
        }
        if n < 6 {
            check("an outage call makes 4 attempts", reached == 4);
        } else {
            check(
                "once open, the breaker fails the call without reaching the server",
                reached == 0 && state == State::Open,
            );
            check(
                "an open circuit reaches the caller as UNAVAILABLE",
                code == Some(Code::Unavailable),
            );
        }
    }

    let snapshot = &breaker.list()[0];
    println!(
        "\nbreaker {:?}: {:?}, opened {} time(s), refused {} call(s); the server saw {} calls in all",
        snapshot.key,
        snapshot.state,
        snapshot.opened,
        snapshot.rejected,
        calls()
    );

    let _ = stop.send(());
    let _ = server.await;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
