//! `POST /admin/memory-budget`: the live memory budget of a server over an offloaded model. Loopback
//! peers only (403 otherwise), with the API key when one is set (checked by `guard.rs`); not routed
//! at all when [`ServeOptions::admin`](crate::ServeOptions::admin) is off. The body is `{"bytes": N}`
//! or `{"budget": "300M"}` (a size as `--memory-budget` takes it, at most 1 PiB in every form), the
//! budget of the whole process; the neuron cache gets what stays
//! after the resident file, the KV cache and the predictors, and shrinks or grows while requests are
//! served (the engine's [`CacheControl::set_budget`] applies it between two layer steps; the
//! cache's size comes from `engine::MemoryBudget::cache_bytes`, as at load). A bad body is a 400 with
//! one line; a budget below the model's minimum is a 400 naming the minimum.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::{CacheControl, CacheReport, MemoryBudget, OffloadError};
use serde_json::{json, Value};

use crate::routes::AppState;
use crate::ApiError;

/// Whether `ip` is this machine's loopback (an IPv4-mapped IPv6 address as its IPv4 one).
pub(crate) fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
    }
}

/// The process budget asked for in `body`, or a one-line reason it is not one.
pub(crate) fn parse_budget(body: &[u8]) -> Result<u64, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let Some(o) = v.as_object() else {
        return Err(r#"body must be an object: {"bytes": N} or {"budget": "300M"}"#.into());
    };
    if let Some(k) = o.keys().find(|k| *k != "bytes" && *k != "budget") {
        return Err(format!(
            r#"unknown field `{k}`: give {{"bytes": N}} or {{"budget": "300M"}}"#
        ));
    }
    let bytes = match (o.get("bytes"), o.get("budget")) {
        (Some(b), None) => b
            .as_u64()
            .ok_or_else(|| format!("`bytes` must be a whole number of bytes, not {b}")),
        (None, Some(Value::String(s))) => {
            engine::parse_size(s).map_err(|e| format!("`budget`: {e}"))
        }
        (None, Some(Value::Number(n))) => n
            .as_u64()
            .ok_or_else(|| format!("`budget` must be a size such as \"300M\", not {n}")),
        (None, Some(b)) => Err(format!("`budget` must be a size such as \"300M\", not {b}")),
        (Some(_), Some(_)) => Err("give `bytes` or `budget`, not both".into()),
        (None, None) => Err(r#"give {"bytes": N} or {"budget": "300M"}"#.into()),
    }?;
    // The cap `--memory-budget` and a `"budget"` string have, whatever the form.
    if bytes > MAX_BUDGET {
        return Err(format!("{bytes} bytes is more than 1 PiB"));
    }
    Ok(bytes)
}

/// The largest budget: 1 PiB, as [`engine::parse_size`] allows.
const MAX_BUDGET: u64 = 1 << 50;

/// The JSON answer: the budgets and what the cache holds.
pub(crate) fn report_json(r: &CacheReport) -> Value {
    json!({
        "memory_budget_bytes": r.memory_budget,
        "minimum_bytes": r.minimum,
        "cache_budget_bytes": r.cache_budget,
        "cache_bytes": r.cache_bytes,
        "ffn_bytes": r.ffn_bytes,
    })
}

pub(crate) async fn memory_budget(
    State(st): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if !is_loopback(peer.ip()) {
        return ApiError::forbidden(format!(
            "/admin/memory-budget answers loopback clients only, not {}",
            peer.ip()
        ))
        .into_response();
    }
    let body = match body {
        Ok(b) => b,
        Err(r) => return ApiError::bad_request(r.body_text()).into_response(),
    };
    let Some(ctl): Option<CacheControl> = st.cache.clone() else {
        return ApiError::bad_request(
            "this server's model is in memory, not offloaded: it has no neuron cache to resize (serve a bundle made by `sparrow convert`)",
        )
        .into_response();
    };
    let bytes = match parse_budget(&body) {
        Ok(b) => b,
        Err(e) => return ApiError::bad_request(e).into_response(),
    };
    // A grow reads hot clusters from flash, and a resize waits for the layer step in flight.
    match tokio::task::spawn_blocking(move || ctl.set_budget(MemoryBudget::Process(bytes))).await {
        Ok(Ok(r)) => {
            let mut v = report_json(&r);
            v["rss_bytes"] = json!(engine::sys::rss_bytes());
            Json(v).into_response()
        }
        Ok(Err(OffloadError::Request(e))) => ApiError::bad_request(e).into_response(),
        Ok(Err(e)) => {
            ApiError::internal(format!("resizing the neuron cache failed: {e}")).into_response()
        }
        Err(_) => ApiError::internal("resizing the neuron cache failed").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_peers_are_admins() {
        for ip in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "10.0.0.1",
            "192.168.1.5",
            "0.0.0.0",
            "::ffff:10.0.0.1",
            "fe80::1",
        ] {
            assert!(!is_loopback(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn budget_bodies() {
        assert_eq!(parse_budget(br#"{"bytes": 1048576}"#), Ok(1 << 20));
        assert_eq!(parse_budget(br#"{"budget": "300M"}"#), Ok(300 << 20));
        assert_eq!(parse_budget(br#"{"budget": "1.5G"}"#), Ok(3 << 29));
        assert_eq!(parse_budget(br#"{"budget": 4096}"#), Ok(4096));
        assert_eq!(parse_budget(br#"{"bytes": 1125899906842624}"#), Ok(1 << 50));
        for (bad, says) in [
            (&br#"{"bytes": -1}"#[..], "whole number"),
            (br#"{"bytes": 1.5}"#, "whole number"),
            (br#"{"budget": "lots"}"#, "not a size"),
            (br#"{"budget": true}"#, "must be a size"),
            (br#"{"bytes": 1, "budget": "1M"}"#, "not both"),
            (br#"{"size": 1}"#, "unknown field `size`"),
            (br#"{}"#, "give"),
            (br#"[1]"#, "must be an object"),
            (b"300M", "not JSON"),
            (br#"{"bytes": 1125899906842625}"#, "more than 1 PiB"),
            (br#"{"bytes": 18446744073709551615}"#, "more than 1 PiB"),
            (br#"{"budget": 1125899906842625}"#, "more than 1 PiB"),
        ] {
            let e = parse_budget(bad).unwrap_err();
            assert!(e.contains(says), "{}: {e}", String::from_utf8_lossy(bad));
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}
