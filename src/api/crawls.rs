//! `/crawls`: crawl jobs run by the daemon on its live pool. `POST` starts
//! one (the options of `proxywarden crawl` as JSON), `GET` lists them or
//! shows one with its progress and summary, `/crawls/{id}/pages` streams
//! its JSON lines (`?after=N` skips the first N), `DELETE` cancels.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::query::Params;
use super::{ApiError, AppState};
use crate::crawl::jobs::{DEFAULT_LISTED, JobError, MAX_LISTED};

/// The largest job body read: options and up to a thousand seeds.
const MAX_JOB_BODY: usize = 1024 * 1024;

fn job_error(e: JobError) -> ApiError {
    match e {
        JobError::Spec(s) => ApiError::BadRequest(s.to_string()),
        JobError::Store(e) => ApiError::from(e),
        JobError::Stopping => ApiError::NotReady("the daemon is stopping".into()),
        e @ JobError::QueueFull(_) => ApiError::QueueFull {
            message: e.to_string(),
            retry_after: 60,
        },
        JobError::Io(e) => ApiError::Internal(e.to_string()),
    }
}

fn job_id(id: Result<Path<String>, PathRejection>) -> Result<i64, ApiError> {
    let Path(id) =
        id.map_err(|e| ApiError::BadRequest(format!("invalid crawl id in the path: {e}")))?;
    id.parse()
        .map_err(|_| ApiError::BadRequest(format!("crawl id {id:?} is not a number")))
}

fn no_job(id: i64) -> ApiError {
    ApiError::NotFound(format!("no crawl job {id}"))
}

/// `POST /crawls`: starts a job; `201` with its view.
#[utoipa::path(post, path = "/crawls", tag = "crawls",
    request_body = super::schema::CrawlSpec,
    responses((status = 201, description = "The job, queued", body = super::schema::CrawlJob),
        super::schema::Errors))]
pub async fn start(
    State(state): State<AppState>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, MAX_JOB_BODY))
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ApiError::PayloadTooLarge(MAX_JOB_BODY)
            } else {
                ApiError::BadRequest(
                    "the request body could not be read: its framing (chunked encoding or \
                     length) is broken"
                        .into(),
                )
            }
        })?
        .to_bytes();
    let job = state.crawls.start(&body).await.map_err(job_error)?;
    let location = format!("/crawls/{}", job.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(job),
    )
        .into_response())
}

/// `GET /crawls?limit=N&after=ID`: a page of jobs, newest first; `after`
/// continues after job ID (the `next` of the previous page). The list
/// leaves each job's seeds and patterns out.
#[utoipa::path(get, path = "/crawls", tag = "crawls",
    params(super::schema::CrawlListParams),
    responses((status = 200, description = "A page of jobs", body = super::schema::CrawlList),
        super::schema::Errors))]
pub async fn list(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(raw.as_deref(), &["limit", "after"])?;
    let limit = p
        .number("limit", 1, MAX_LISTED as i64)?
        .map_or(DEFAULT_LISTED, |n| n as usize);
    let after = p.number("after", 1, i64::MAX)?;
    let jobs = state.crawls.list(limit, after).await?;
    // A full page may have more after it.
    let next = if jobs.len() == limit {
        jobs.last().map(|j| j.id)
    } else {
        None
    };
    Ok(Json(serde_json::json!({ "crawls": jobs, "next": next })).into_response())
}

/// `GET /crawls/{id}`: a job's state, progress and summary.
#[utoipa::path(get, path = "/crawls/{id}", tag = "crawls",
    params(("id" = i64, Path, description = "The job's id")),
    responses((status = 200, description = "The job", body = super::schema::CrawlJob),
        super::schema::Errors))]
pub async fn show(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = job_id(id)?;
    let job = state.crawls.get(id).await?.ok_or_else(|| no_job(id))?;
    Ok(Json(job).into_response())
}

/// `DELETE /crawls/{id}`: cancels a job; its view once it stopped. A job
/// that had already ended answers 409, naming how.
#[utoipa::path(delete, path = "/crawls/{id}", tag = "crawls",
    params(("id" = i64, Path, description = "The job's id")),
    responses((status = 200, description = "The job, once it stopped", body = super::schema::CrawlJob),
        (status = 409, description = "The job had already ended", body = super::schema::ErrorBody),
        super::schema::Errors))]
pub async fn cancel(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = job_id(id)?;
    let before = state.crawls.get(id).await?.ok_or_else(|| no_job(id))?;
    if !matches!(before.state.as_str(), "queued" | "running") {
        return Err(ApiError::Conflict(format!(
            "crawl job {id} had already ended ({}); there is nothing to cancel",
            before.state
        )));
    }
    let job = state.crawls.cancel(id).await?.ok_or_else(|| no_job(id))?;
    Ok(Json(job).into_response())
}

/// `GET /crawls/{id}/pages?after=N`: the job's page lines (JSON Lines)
/// after the first N; `X-Crawl-Lines` says how many there are in all, the
/// `after` of the next call.
#[utoipa::path(get, path = "/crawls/{id}/pages", tag = "crawls",
    params(("id" = i64, Path, description = "The job's id"), super::schema::PagesParams),
    responses((status = 200, description = "The job's pages as JSON Lines; X-Crawl-Lines counts them all",
        content((String = "application/x-ndjson"))),
        super::schema::Errors))]
pub async fn pages(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let id = job_id(id)?;
    let p = Params::parse(raw.as_deref(), &["after"])?;
    let after = p.number("after", 0, i64::MAX)?.unwrap_or(0) as u64;
    let (lines, stream) = state
        .crawls
        .pages(id, after)
        .await
        .map_err(job_error)?
        .ok_or_else(|| no_job(id))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_owned()),
            (
                header::HeaderName::from_static("x-crawl-lines"),
                lines.to_string(),
            ),
        ],
        axum::body::Body::from_stream(stream.into_stream()),
    )
        .into_response())
}
