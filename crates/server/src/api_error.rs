//! Errors answered to one client, in OpenAI's JSON shape: `{"error": {"message", "type", "param",
//! "code"}}` with the HTTP status that fits.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// One request's failure: its status and what the client reads. The server keeps serving.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable, one line.
    pub message: String,
    /// The offending request field, if one.
    pub param: Option<&'static str>,
    /// Machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400: a malformed body or a bad parameter.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 naming the parameter.
    pub fn bad_param(param: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param),
            ..Self::bad_request(message)
        }
    }

    /// 404 for a model this server does not have.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        ApiError {
            param: Some("model"),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("the model `{asked}` does not exist; this server has `{served}`"),
            )
        }
    }

    /// 404 for a path that is not an endpoint.
    pub fn no_route(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("no endpoint {path}"))
    }

    /// 413: the body is larger than the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 429: the queue is full.
    pub fn queue_full(limit: usize) -> Self {
        ApiError {
            code: Some("queue_full"),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("the server is busy: {limit} requests are already waiting; retry later"),
            )
        }
    }

    /// 429: the requests already admitted hold the queue's memory.
    pub fn queue_memory_full(asked: u64, limit: u64) -> Self {
        ApiError {
            code: Some("queue_full"),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "the server is busy: this request needs {} KiB of the queue's {} KiB (--queue-memory) and the requests already admitted hold the rest; retry later",
                    asked.div_ceil(1024),
                    limit / 1024
                ),
            )
        }
    }

    /// 503: the request ran out of time.
    pub fn timeout(secs: f64) -> Self {
        ApiError {
            code: Some("timeout"),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the request took longer than the server's limit of {secs:.0} s"),
            )
        }
    }

    /// 503: the engine is gone (the server is stopping).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 403: a client that may not use the endpoint (`/admin/...` from another machine).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    /// 401: no API key, or a wrong one (OpenAI's shape and code).
    pub fn unauthorized() -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "invalid or missing API key: send `Authorization: Bearer KEY`",
            )
        }
    }

    /// 415: a JSON endpoint called with another content type.
    pub fn not_json(got: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("this endpoint takes `Content-Type: application/json`, not `{got}`"),
        )
    }

    /// 408: the body did not arrive in time.
    pub fn body_timeout(secs: f64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {secs:.0} s"),
        )
    }

    /// 500: the engine failed on this request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// OpenAI's error `type` for the status.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
