//! What a browser says about where an API request comes from. A page of
//! another site can make a browser send GETs to this API (`<img src>`, a
//! no-cors fetch) with side effects such as `verify=true`'s judge traffic:
//! such requests (`Sec-Fetch-Site: cross-site`, or an `Origin` that is not
//! this API's) are refused. `/judge` echoes anyone, and the dashboard's
//! forms have their own guard.

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// Refuses API requests a browser made for another site's page.
pub(super) async fn refuse_cross_site(req: Request, next: Next) -> Response {
    if req.uri().path() != "/judge"
        && let Err(why) = from_this_site(req.headers())
    {
        return ApiError::CrossSite(why).into_response();
    }
    next.run(req).await
}

/// `Err` (why) when the browser marks the request as another site's.
/// Clients that are not browsers send neither header and pass.
fn from_this_site(headers: &HeaderMap) -> Result<(), String> {
    if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"))
    {
        return Err("the browser says another site's page made this request \
                    (Sec-Fetch-Site: cross-site); the API answers its own clients"
            .into());
    }
    match super::dashboard::session::foreign_origin(headers) {
        None => Ok(()),
        Some((shown, host)) => Err(format!(
            "this request comes from a page of another origin ({shown:?}, not this API's \
             {host:?}); the API answers its own clients"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn pages_of_other_sites_are_told_apart_from_clients() {
        assert!(from_this_site(&headers(&[("host", "127.0.0.1:8080")])).is_ok());
        assert!(
            from_this_site(&headers(&[
                ("host", "127.0.0.1:8080"),
                ("sec-fetch-site", "same-origin"),
                ("origin", "http://127.0.0.1:8080"),
            ]))
            .is_ok()
        );
        for bad in [
            &[("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")][..],
            &[
                ("host", "127.0.0.1:8080"),
                ("origin", "https://evil.example"),
            ][..],
            &[("host", "127.0.0.1:8080"), ("origin", "null")][..],
            &[("origin", "http://127.0.0.1:8080")][..],
        ] {
            assert!(from_this_site(&headers(bad)).is_err(), "{bad:?}");
        }
    }
}
