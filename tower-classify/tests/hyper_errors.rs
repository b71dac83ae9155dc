//! `hyper::Error`s from real connections are classified by what went wrong.

use http::Request;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower_classify::{ErrorChainClassifier, FailureKind, Outcome};

/// Sends one GET to a server that answers with `reply` and closes, and returns
/// the client's error.
async fn hyper_error_from(reply: &'static [u8]) -> hyper::Error {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = socket.read(&mut buf).await;
        socket.write_all(reply).await.unwrap();
        socket.shutdown().await.unwrap();
    });
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::get("/")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let error = sender.send_request(request).await.unwrap_err();
    server.await.unwrap();
    error
}

#[tokio::test]
async fn connection_closed_before_a_response_is_a_connection_failure() {
    let error = hyper_error_from(b"").await;
    let boxed: tower_classify::BoxError = Box::new(error);
    assert_eq!(
        ErrorChainClassifier::new().classify_error(&*boxed),
        Outcome::failure(FailureKind::Connection)
    );
}

#[tokio::test]
async fn a_malformed_response_is_rejected() {
    let error = hyper_error_from(b"this is not HTTP\r\n\r\n").await;
    assert!(error.is_parse(), "{error:?}");
    assert_eq!(
        ErrorChainClassifier::new().classify_error(&error),
        Outcome::failure(FailureKind::Rejected)
    );
}
