//! `/openapi.json`: the OpenAPI 3 document of every route, built by
//! `utoipa` from the handlers' `#[utoipa::path]` attributes and the types
//! they answer with; the shapes described beside them are in `schema`.

use axum::Json;
use utoipa::OpenApi;

use super::schema::{ErrorBody, ErrorDetail, Errors};
use super::{browse, crawls, dashboard, handlers};

/// The API's document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "proxywarden",
        description = "Serves working proxies from a pool that is harvested and checked continuously. \
            With api.token set, every route but /healthz, /judge and /openapi.json needs `Authorization: Bearer <token>` \
            (or, for reading and the dashboard's forms, the dashboard's session cookie)."
    ),
    paths(
        handlers::proxy,
        handlers::proxies,
        handlers::report,
        browse::browse,
        handlers::export,
        handlers::stats,
        handlers::sources,
        handlers::metrics,
        handlers::healthz,
        crawls::list,
        crawls::start,
        crawls::show,
        crawls::cancel,
        crawls::pages,
        super::judge_route,
        dashboard::dashboard,
        dashboard::login_page,
        dashboard::login,
        dashboard::logout,
        dashboard::cancel,
        openapi_json,
    ),
    components(schemas(ErrorBody, ErrorDetail)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

/// Declares the bearer token.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document, rendered once.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `GET /openapi.json`: this document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", security(()),
    responses((status = 200, description = "The OpenAPI 3 document of this API", body = Object), Errors))]
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_document_is_openapi_3() {
        let doc = serde_json::to_value(super::document()).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        assert!(doc["paths"]["/proxy"]["get"].is_object());
        assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    }

    /// `POST /crawls` is documented from the spec the handler parses:
    /// every field it reads is in the schema, `seeds` the one required.
    #[test]
    fn the_crawl_schema_is_the_crawl_spec() {
        let doc = serde_json::to_value(super::document()).unwrap();
        let spec = &doc["components"]["schemas"]["CrawlSpec"];
        let fields = serde_json::to_value(crate::crawl::spec::CrawlSpec {
            seeds: vec!["https://example.com/".into()],
            max_depth: Some(1),
            max_pages: Some(1),
            scope: Some("host".into()),
            include: vec!["a".into()],
            exclude: vec!["b".into()],
            strip_params: vec!["c".into()],
            concurrency: Some(1),
            per_host_concurrency: Some(1),
            delay: Some("1s".into()),
            ignore_robots: true,
            select: [("t".to_owned(), "title".to_owned())].into(),
            select_all: true,
            country: vec!["US".into()],
            scheme: vec!["http".into()],
            anonymity: Some("elite".into()),
            https: true,
            max_latency_ms: Some(1),
            max_age: Some("1m".into()),
            user_agent: Some("ua".into()),
            no_proxy_wait: Some("1s".into()),
        })
        .unwrap();
        for field in fields.as_object().unwrap().keys() {
            assert!(
                spec["properties"][field].is_object(),
                "{field} is not in the CrawlSpec schema: {spec}"
            );
        }
        assert_eq!(spec["required"], serde_json::json!(["seeds"]), "{spec}");
    }
}
