//! The server API over HTTP (`/api/v1/...`, docs/api.md): the key, the
//! budget, JSON in and out, each refusal's status; the operations
//! themselves are [`crate::api`]'s.
//!
//! Every call: 404 when the server has no `--api-key-file`; 401 without
//! the key (`Authorization: Bearer KEY`, compared in constant time); 429
//! over `--api-calls-per-sec`; then the route's own checks (400 for a bad
//! room, user, query or body, 413 past [`MAX_BODY_BYTES`], 415 for a body
//! that is not JSON). Every answer is counted in `amble_api_calls_total`
//! under its operation and status, and logged with the caller's address.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use tracing::info;

use crate::access::sanctions::MAX_REASON_CHARS;
use crate::access::throttle::Admit;
use crate::api::{MAX_SANCTION_SECS, MAX_SUB_BYTES, MAX_SYSTEM_TEXT_CHARS, Op, Who};
use crate::protocol::{MemberId, Rules, text, validate_room};
use crate::room::admin::Listed;
use crate::server::shared::Shared;

use super::json_error;

/// The largest request body read, bytes.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Members per page of `GET /api/v1/rooms/{room}/members`: the default and
/// the most.
pub const DEFAULT_PAGE: usize = 100;
pub const MAX_PAGE: usize = 1_000;

/// The OpenAPI 3 document of this API (checked against the routes by
/// tests/api/openapi_check.py).
const OPENAPI: &str = include_str!("../api/openapi.json");

pub fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/rooms", get(rooms))
        .route("/api/v1/rooms/{room}", axum::routing::delete(close_room))
        .route("/api/v1/rooms/{room}/members", get(members))
        .route("/api/v1/rooms/{room}/kick", post(kick))
        .route("/api/v1/rooms/{room}/messages", post(tell_room))
        .route("/api/v1/users/{sub}", get(user))
        .route("/api/v1/users/{sub}/ban", post(ban).delete(unban))
        .route("/api/v1/users/{sub}/mute", post(mute).delete(unmute))
        .route("/api/v1/users/{sub}/messages", post(tell_user))
        .route("/api/v1/{*rest}", axum::routing::any(unknown))
        .route("/api/v1", axum::routing::any(unknown))
}

/// An answer and the label it is counted under (boxed: refusals travel
/// as the `Err` of every input check).
struct Call {
    op: &'static str,
    response: Box<Response>,
}

fn call(op: &'static str, response: Response) -> Call {
    Call {
        op,
        response: Box::new(response),
    }
}

fn fail(op: &'static str, status: StatusCode, code: &str, message: &str) -> Call {
    call(op, json_error(status, code, message))
}

fn ok(op: &'static str, body: Value) -> Call {
    call(op, (StatusCode::OK, axum::Json(body)).into_response())
}

/// The checks every call passes first: the API is on, the key, the budget.
fn gate(shared: &Shared, headers: &HeaderMap, op: &'static str) -> Result<(), Call> {
    let Some(key) = &shared.api_key else {
        return Err(fail(
            op,
            StatusCode::NOT_FOUND,
            "not_found",
            "the server API is off: start amble with --api-key-file",
        ));
    };
    if let Err(denied) = key.admits(headers) {
        let mut response = json_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the server API needs Authorization: Bearer KEY with the key of --api-key-file",
        );
        let challenge = match denied {
            super::bearer::Denied::Missing => r#"Bearer realm="amble api""#,
            super::bearer::Denied::Wrong => r#"Bearer realm="amble api", error="invalid_token""#,
        };
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
        return Err(call(op, response));
    }
    let now = Instant::now();
    let admit = shared
        .api_budget
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .admit(now);
    if let Admit::At(at) = admit {
        let wait = at.saturating_duration_since(now);
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let mut response = json_error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            &format!(
                "over --api-calls-per-sec ({}): try again in {} ms",
                shared.config.api.api_calls_per_sec,
                wait.as_millis()
            ),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        return Err(call(op, response));
    }
    Ok(())
}

/// Counts and logs one answered call.
fn finish(
    shared: &Shared,
    peer: SocketAddr,
    headers: &HeaderMap,
    method: &Method,
    path: &str,
    c: Call,
) -> Response {
    let status = c.response.status().as_u16();
    shared.metrics.api_call(c.op, status);
    let client = shared.addresses.client_of(peer.ip(), headers);
    info!(%client, %method, path, op = c.op, status, "server API call");
    *c.response
}

/// Runs `handle` behind the gate, then counts and logs its answer.
async fn serve<F, Fut>(
    shared: Arc<Shared>,
    peer: SocketAddr,
    request: Request,
    op: &'static str,
    handle: F,
) -> Response
where
    F: FnOnce(Arc<Shared>, Request) -> Fut,
    // Ok: the answer; Err: a refusal, given with `?`.
    Fut: std::future::Future<Output = Result<Call, Call>>,
{
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let headers = request.headers().clone();
    let answered = match gate(&shared, &headers, op) {
        Ok(()) => handle(Arc::clone(&shared), request)
            .await
            .unwrap_or_else(|refused| refused),
        Err(refused) => refused,
    };
    finish(&shared, peer, &headers, &method, &path, answered)
}

// ------------------------------------------------------------------ inputs

fn room_of(op: &'static str, room: String, rules: &Rules) -> Result<Arc<str>, Call> {
    validate_room(room, rules).map(Into::into).map_err(|err| {
        fail(
            op,
            StatusCode::BAD_REQUEST,
            "invalid_room",
            &err.to_string(),
        )
    })
}

fn sub_of(op: &'static str, sub: String) -> Result<Arc<str>, Call> {
    if sub.is_empty() || sub.len() > MAX_SUB_BYTES || sub.chars().any(char::is_control) {
        return Err(fail(
            op,
            StatusCode::BAD_REQUEST,
            "invalid_user",
            &format!("a user is a token's sub: 1 to {MAX_SUB_BYTES} bytes, no control characters"),
        ));
    }
    Ok(sub.into())
}

/// Reads a JSON body into `T` (unknown fields refused).
async fn body_of<T: serde::de::DeserializeOwned>(
    op: &'static str,
    request: Request,
) -> Result<T, Call> {
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(fail(
            op,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be JSON, sent with Content-Type: application/json",
        ));
    }
    let bytes = match axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return Err(fail(
                op,
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_big",
                &format!("the body is over {MAX_BODY_BYTES} bytes"),
            ));
        }
    };
    serde_json::from_slice(&bytes).map_err(|err| {
        fail(
            op,
            StatusCode::BAD_REQUEST,
            "invalid_body",
            &format!("the body: {err}"),
        )
    })
}

fn reason_of(op: &'static str, reason: Option<String>) -> Result<Arc<str>, Call> {
    let reason = reason.unwrap_or_default();
    if reason.chars().count() > MAX_REASON_CHARS || reason.chars().any(char::is_control) {
        return Err(fail(
            op,
            StatusCode::BAD_REQUEST,
            "invalid_body",
            &format!("reason: at most {MAX_REASON_CHARS} characters, no control characters"),
        ));
    }
    Ok(reason.into())
}

fn until_of(op: &'static str, shared: &Shared, seconds: u64) -> Result<u64, Call> {
    if seconds == 0 || seconds > MAX_SANCTION_SECS {
        return Err(fail(
            op,
            StatusCode::BAD_REQUEST,
            "invalid_body",
            &format!("seconds: 1 to {MAX_SANCTION_SECS} (a year); DELETE lifts it"),
        ));
    }
    Ok(shared
        .api
        .now_ms()
        .saturating_add(seconds.saturating_mul(1000)))
}

fn text_of(op: &'static str, text: String) -> Result<Arc<str>, Call> {
    text::normalize(text, MAX_SYSTEM_TEXT_CHARS)
        .map(Into::into)
        .map_err(|p| {
            fail(
                op,
                StatusCode::BAD_REQUEST,
                "invalid_body",
                &format!(
                    "text: 1 to {MAX_SYSTEM_TEXT_CHARS} characters under the chat text rule ({})",
                    p.reason()
                ),
            )
        })
}

fn member_json(listed: &Listed, node: &str) -> Value {
    json!({
        "id": listed.id.0,
        "name": listed.name,
        "sub": listed.user.as_deref(),
        "room": &*listed.room,
        "node": node,
        "position": { "x": listed.position.x, "y": listed.position.y },
        "joined_at_ms": listed.joined_at_ms,
    })
}

fn members_json(members: &[(Listed, Arc<str>)]) -> Vec<Value> {
    members
        .iter()
        .map(|(l, node)| member_json(l, node))
        .collect()
}

// ------------------------------------------------------------------ routes

async fn openapi(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    serve(shared, peer, request, "openapi", |_, _| async {
        Ok(call(
            "openapi",
            (
                StatusCode::OK,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                OPENAPI,
            )
                .into_response(),
        ))
    })
    .await
}

async fn unknown(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    serve(shared, peer, request, "unknown", |_, request| async move {
        Err(fail(
            "unknown",
            StatusCode::NOT_FOUND,
            "not_found",
            &format!(
                "no such operation: {} {} (GET /api/v1/openapi.json lists them)",
                request.method(),
                request.uri().path()
            ),
        ))
    })
    .await
}

async fn rooms(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    serve(shared, peer, request, "rooms", |shared, _| async move {
        let counts = shared.room_counts().await;
        let rooms: Vec<Value> = counts
            .into_iter()
            .map(|(name, members)| {
                let (capacity, spatial) = (shared.rooms.capacity_of(&name), shared.rooms.is_spatial(&name));
                json!({ "name": name, "members": members, "capacity": capacity, "spatial": spatial })
            })
            .collect();
        Ok(ok("rooms", json!({ "rooms": rooms })))
    })
    .await
}

/// `?limit=N&cursor=C`: a page size and where the last page ended.
fn page_of(query: Option<&str>) -> Result<(usize, Option<u32>), String> {
    let (mut limit, mut cursor) = (DEFAULT_PAGE, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or(format!("limit: a whole number from 1 to {MAX_PAGE}"))?;
            }
            "cursor" => {
                cursor = Some(
                    value
                        .parse()
                        .map_err(|_| "cursor: the next_cursor of the page before".to_owned())?,
                );
            }
            other => {
                return Err(format!(
                    "unknown query parameter {other:?}: limit and cursor only"
                ));
            }
        }
    }
    Ok((limit, cursor))
}

async fn members(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(room): Path<String>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    const OP: &str = "members";
    serve(shared, peer, request, OP, |shared, _| async move {
        let room = room_of(OP, room, &shared.rules)?;
        let (limit, cursor) = match page_of(query.as_deref()) {
            Ok(page) => page,
            Err(text) => return Err(fail(OP, StatusCode::BAD_REQUEST, "invalid_query", &text)),
        };
        let mut answer = shared.api_run(Op::Members { room: Arc::clone(&room) }).await;
        answer.members.sort_by_key(|(l, _)| l.id);
        let after: Vec<&(Listed, Arc<str>)> = answer
            .members
            .iter()
            .filter(|(l, _)| cursor.is_none_or(|c| l.id.0 > c))
            .collect();
        let page: Vec<Value> = after.iter().take(limit).map(|(l, n)| member_json(l, n)).collect();
        let next = (after.len() > limit).then(|| after[limit - 1].0.id.0.to_string());
        Ok(ok(
            OP,
            json!({ "room": &*room, "total": answer.members.len(), "members": page, "next_cursor": next }),
        ))
    })
    .await
}

async fn user(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(sub): Path<String>,
    request: Request,
) -> Response {
    const OP: &str = "user";
    serve(shared, peer, request, OP, |shared, _| async move {
        let sub = sub_of(OP, sub)?;
        let mut answer = shared
            .api_run(Op::User {
                user: Arc::clone(&sub),
            })
            .await;
        answer.members.sort_by(|(a, _), (b, _)| a.room.cmp(&b.room));
        let sanction = shared
            .sanctions
            .of(&sub, shared.api.now_ms())
            .unwrap_or_default();
        Ok(ok(
            OP,
            json!({
                "sub": &*sub,
                "members": members_json(&answer.members),
                "banned_until_ms": (sanction.ban_until_ms > 0).then_some(sanction.ban_until_ms),
                "ban_reason": (sanction.ban_until_ms > 0).then_some(&*sanction.ban_reason),
                "muted_until_ms": (sanction.mute_until_ms > 0).then_some(sanction.mute_until_ms),
            }),
        ))
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KickBody {
    member_id: Option<u32>,
    sub: Option<String>,
    reason: Option<String>,
}

async fn kick(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(room): Path<String>,
    request: Request,
) -> Response {
    const OP: &str = "kick";
    serve(shared, peer, request, OP, |shared, request| async move {
        let room = room_of(OP, room, &shared.rules)?;
        let body: KickBody = body_of(OP, request).await?;
        let who = match (body.member_id, body.sub) {
            (Some(id), None) => Who::Member(MemberId(id)),
            (None, Some(sub)) => Who::User(sub_of(OP, sub)?),
            _ => {
                return Err(fail(
                    OP,
                    StatusCode::BAD_REQUEST,
                    "invalid_body",
                    "name whom to kick: member_id or sub, one of the two",
                ));
            }
        };
        let reason = reason_of(OP, body.reason)?;
        let answer = shared
            .api_run(Op::Kick {
                room: Arc::clone(&room),
                who,
                reason,
            })
            .await;
        if answer.members.is_empty() {
            return Err(fail(
                OP,
                StatusCode::NOT_FOUND,
                "member_not_found",
                &format!("no such member in room {room}"),
            ));
        }
        Ok(ok(OP, json!({ "kicked": members_json(&answer.members) })))
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BanBody {
    seconds: u64,
    reason: Option<String>,
}

async fn ban(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(sub): Path<String>,
    request: Request,
) -> Response {
    const OP: &str = "ban";
    serve(shared, peer, request, OP, |shared, request| async move {
        let sub = sub_of(OP, sub)?;
        let body: BanBody = body_of(OP, request).await?;
        let until_ms = until_of(OP, &shared, body.seconds)?;
        let reason = reason_of(OP, body.reason)?;
        let answer = shared
            .api_run(Op::Ban { user: Arc::clone(&sub), until_ms, reason })
            .await;
        Ok(ok(
            OP,
            json!({ "sub": &*sub, "banned_until_ms": until_ms, "kicked": members_json(&answer.members) }),
        ))
    })
    .await
}

async fn unban(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(sub): Path<String>,
    request: Request,
) -> Response {
    const OP: &str = "unban";
    serve(shared, peer, request, OP, |shared, _| async move {
        let sub = sub_of(OP, sub)?;
        shared
            .api_run(Op::Ban {
                user: Arc::clone(&sub),
                until_ms: 0,
                reason: "".into(),
            })
            .await;
        Ok(ok(OP, json!({ "sub": &*sub, "banned_until_ms": null })))
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MuteBody {
    seconds: u64,
}

async fn mute(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(sub): Path<String>,
    request: Request,
) -> Response {
    const OP: &str = "mute";
    serve(shared, peer, request, OP, |shared, request| async move {
        let sub = sub_of(OP, sub)?;
        let body: MuteBody = body_of(OP, request).await?;
        let until_ms = until_of(OP, &shared, body.seconds)?;
        shared
            .api_run(Op::Mute {
                user: Arc::clone(&sub),
                until_ms,
            })
            .await;
        Ok(ok(OP, json!({ "sub": &*sub, "muted_until_ms": until_ms })))
    })
    .await
}

async fn unmute(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(sub): Path<String>,
    request: Request,
) -> Response {
    const OP: &str = "unmute";
    serve(shared, peer, request, OP, |shared, _| async move {
        let sub = sub_of(OP, sub)?;
        shared
            .api_run(Op::Mute {
                user: Arc::clone(&sub),
                until_ms: 0,
            })
            .await;
        Ok(ok(OP, json!({ "sub": &*sub, "muted_until_ms": null })))
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextBody {
    text: String,
}

async fn tell_room(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(room): Path<String>,
    request: Request,
) -> Response {
    const OP: &str = "message_room";
    serve(shared, peer, request, OP, |shared, request| async move {
        let room = room_of(OP, room, &shared.rules)?;
        let text = body_of::<TextBody>(OP, request)
            .await
            .and_then(|b| text_of(OP, b.text))?;
        let answer = shared
            .api_run(Op::Tell {
                room: Some(room),
                user: None,
                text,
            })
            .await;
        Ok(ok(OP, json!({ "delivered": answer.reached })))
    })
    .await
}

async fn tell_user(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(sub): Path<String>,
    request: Request,
) -> Response {
    const OP: &str = "message_user";
    serve(shared, peer, request, OP, |shared, request| async move {
        let sub = sub_of(OP, sub)?;
        let text = body_of::<TextBody>(OP, request)
            .await
            .and_then(|b| text_of(OP, b.text))?;
        let answer = shared
            .api_run(Op::Tell {
                room: None,
                user: Some(sub),
                text,
            })
            .await;
        if answer.reached == 0 {
            return Err(fail(
                OP,
                StatusCode::NOT_FOUND,
                "user_not_found",
                "the user is in no room",
            ));
        }
        Ok(ok(OP, json!({ "delivered": answer.reached })))
    })
    .await
}

async fn close_room(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(room): Path<String>,
    request: Request,
) -> Response {
    const OP: &str = "close_room";
    serve(shared, peer, request, OP, |shared, _| async move {
        let room = room_of(OP, room, &shared.rules)?;
        let answer = shared
            .api_run(Op::Close {
                room: Arc::clone(&room),
            })
            .await;
        if answer.members.is_empty() {
            return Err(fail(
                OP,
                StatusCode::NOT_FOUND,
                "room_not_found",
                &format!("room {room} has nobody in it"),
            ));
        }
        Ok(ok(OP, json!({ "closed": members_json(&answer.members) })))
    })
    .await
}
