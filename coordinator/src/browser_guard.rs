//! The open API (`--open-api`, local use: no token, one admin over every team) against the web
//! pages its developer opens. A page may send a "simple" cross-site request (a `text/plain`
//! or form body, no preflight) to `http://127.0.0.1:8080`, or reach it under a name of its
//! own that resolves to 127.0.0.1 (DNS rebinding). So, with the API open, a request is refused
//! when its `Host` is a name other than `localhost` or one the operator lists
//! (`FLEET_API_HOSTS`, separated by `,`), when it comes from another origin (`Origin`,
//! `Sec-Fetch-Site`), and when it sends a body that is not JSON (`application/octet-stream`
//! for a pack upload). A token-serving API needs none of this: a page cannot send its token.

use axum::http::{header, HeaderMap, Method, StatusCode};

/// Why a request to the open API is refused, and its status.
pub(crate) fn refused(
    headers: &HeaderMap,
    method: &Method,
    route: &str,
    hosts: &[String],
) -> Option<(StatusCode, String)> {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let host = text(header::HOST).unwrap_or_default();
    if !host_allowed(host, hosts) {
        return Some((
            StatusCode::FORBIDDEN,
            format!(
                "the open API answers requests for localhost or an address only, not `{}` \
                 (FLEET_API_HOSTS lists more names)",
                shared::text::head(host, 100)
            ),
        ));
    }
    if let Some(origin) = text(header::ORIGIN) {
        let own = [format!("http://{host}"), format!("https://{host}")];
        if !own.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
            return Some((
                StatusCode::FORBIDDEN,
                "the open API refuses requests from another origin (a web page)".into(),
            ));
        }
    }
    if let Some("cross-site" | "same-site") =
        headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
    {
        return Some((
            StatusCode::FORBIDDEN,
            "the open API refuses requests from another site (a web page)".into(),
        ));
    }
    if method == Method::GET || method == Method::HEAD {
        return None;
    }
    let wanted = if route == "/v1/uploads" {
        "application/octet-stream"
    } else {
        "application/json"
    };
    let kind = text(header::CONTENT_TYPE).unwrap_or_default();
    let essence = kind.split(';').next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case(wanted) {
        return Some((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "the body must be sent as `{wanted}`, not `{}`",
                shared::text::head(essence, 100)
            ),
        ));
    }
    None
}

/// `localhost`, an address, or a listed name; with or without a port.
fn host_allowed(host: &str, hosts: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    if name.is_empty() {
        return false;
    }
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok()
        || hosts.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// `FLEET_API_HOSTS`, read once.
pub(crate) fn hosts_from_env() -> &'static [String] {
    static HOSTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    HOSTS.get_or_init(|| {
        std::env::var("FLEET_API_HOSTS")
            .unwrap_or_default()
            .split(',')
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn pages_of_other_origins_and_non_json_bodies_are_refused() {
        let ok = headers(&[
            ("host", "127.0.0.1:8080"),
            ("content-type", "application/json"),
        ]);
        assert!(refused(&ok, &Method::POST, "/v1/runs", &[]).is_none());
        let plain = headers(&[("host", "127.0.0.1:8080"), ("content-type", "text/plain")]);
        let (status, _) = refused(&plain, &Method::POST, "/v1/runs", &[]).unwrap();
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let page = headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "https://evil.example"),
            ("content-type", "application/json"),
        ]);
        assert_eq!(
            refused(&page, &Method::POST, "/v1/runs", &[]).unwrap().0,
            StatusCode::FORBIDDEN
        );
        let own = headers(&[
            ("host", "localhost:8080"),
            ("origin", "http://localhost:8080"),
        ]);
        assert!(refused(&own, &Method::GET, "/v1/runs", &[]).is_none());
        let rebound = headers(&[("host", "evil.example:8080")]);
        assert!(refused(&rebound, &Method::GET, "/v1/runs", &[]).is_some());
        let listed = vec!["fleet.internal".to_string()];
        let named = headers(&[("host", "fleet.internal:8080")]);
        assert!(refused(&named, &Method::GET, "/v1/runs", &listed).is_none());
        let v6 = headers(&[("host", "[::1]:8080")]);
        assert!(refused(&v6, &Method::GET, "/v1/runs", &[]).is_none());
        let pack = headers(&[
            ("host", "127.0.0.1"),
            ("content-type", "application/octet-stream"),
        ]);
        assert!(refused(&pack, &Method::POST, "/v1/uploads", &[]).is_none());
        assert!(refused(&pack, &Method::POST, "/v1/runs", &[]).is_some());
    }
}
