//! An adapter from tower-http's [`ClassifyResponse`] (feature `tower-http`):
//! tower-http decides *whether* a response failed, a map *how* (a retry must
//! tell a 503 from a 404).
//!
//! Two limits come from tower-http's trait: a response it can only judge at
//! the end of the stream (`RequiresEos`, gRPC trailers) counts as a success
//! here (judge trailers with [`GrpcClassifier`](crate::GrpcClassifier)'s
//! `classify_end`), and
//! it sees errors only through `Display`, so errors are classified by
//! [`ErrorChainClassifier`], which walks their `source()` chain.

use std::fmt;

use ::tower_http::classify::{
    ClassifiedResponse, ClassifyResponse, ServerErrorsAsFailures, ServerErrorsFailureClass,
};
use http::Response;

use crate::classify::{Classify, ClassifyExt};
use crate::error_chain::{AsDynError, ErrorChainClassifier};
use crate::http::HttpClassifier;
use crate::outcome::{FailureKind, Outcome};

/// A tower-http [`ClassifyResponse`] used as a [`Classify`]; see the
/// [module docs](self).
///
/// ```
/// use http::{Response, StatusCode};
/// use tower_classify::tower_http::from_server_errors;
/// use tower_classify::{BoxError, Classify, FailureKind, Outcome};
///
/// let classifier = from_server_errors();
/// let unavailable = Response::builder().status(StatusCode::SERVICE_UNAVAILABLE).body(()).unwrap();
/// let outcome = Classify::<_, BoxError>::classify(&classifier, Ok(&unavailable));
/// assert_eq!(outcome, Outcome::failure(FailureKind::ServerError));
/// ```
#[derive(Clone)]
pub struct TowerHttpClassifier<C, F> {
    classifier: C,
    map: F,
}

impl<C, F> TowerHttpClassifier<C, F> {
    /// Adapts `classifier`; `map` says what each of its failure classes means.
    pub fn new(classifier: C, map: F) -> Self {
        TowerHttpClassifier { classifier, map }
    }
}

/// tower-http's [`ServerErrorsAsFailures`] (5xx are failures), each failing
/// status read with [`HttpClassifier`]'s table.
pub fn from_server_errors(
) -> TowerHttpClassifier<ServerErrorsAsFailures, fn(ServerErrorsFailureClass) -> Outcome> {
    TowerHttpClassifier::new(ServerErrorsAsFailures::new(), |class| match class {
        ServerErrorsFailureClass::StatusCode(status) => HttpClassifier::new().classify_parts(
            status,
            &http::HeaderMap::new(),
            None,
            std::time::SystemTime::now(),
        ),
        // Only reached for errors tower-http classified itself; the adapter
        // classifies errors by their chain instead.
        ServerErrorsFailureClass::Error(_) => Outcome::failure(FailureKind::Connection),
    })
}

impl<C, F, B, E> Classify<Response<B>, E> for TowerHttpClassifier<C, F>
where
    C: ClassifyResponse + Clone,
    F: Fn(C::FailureClass) -> Outcome,
    E: AsDynError,
{
    fn classify(&self, result: Result<&Response<B>, &E>) -> Outcome {
        match result {
            Ok(response) => match self.classifier.clone().classify_response(response) {
                ClassifiedResponse::Ready(Ok(())) | ClassifiedResponse::RequiresEos(_) => {
                    Outcome::Success
                }
                ClassifiedResponse::Ready(Err(class)) => (self.map)(class),
            },
            Err(err) => ErrorChainClassifier::new().classify_error(err.as_dyn_error()),
        }
    }
}

impl<C, F> ClassifyExt for TowerHttpClassifier<C, F> {}

impl<C: fmt::Debug, F> fmt::Debug for TowerHttpClassifier<C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TowerHttpClassifier")
            .field("classifier", &self.classifier)
            .field("map", &std::any::type_name::<F>())
            .finish()
    }
}
