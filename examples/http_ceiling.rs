//! The HTTP ceiling of this machine: a minimal axum server that answers every
//! request with a fixed body shaped like start_turn's reply. `bench/run`
//! loads it exactly like turnstore, so results read as a fraction of it.
//! Usage: `http_ceiling 127.0.0.1:9090`

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;

const BODY: &str = r#"{"session_id":"bench-1","user_id":null,"turn_id":"01a2b3c4-d5e6-7f80-9a1b-2c3d4e5f6a7b","seq":1,"started_at":"2026-11-22T16:00:00.000Z","history":{"session_id":"bench-1","user_id":null,"format":"text","encoding":"o200k_base","token_count":0,"total_turns":0,"included_turns":0,"omitted_turns":0,"pending_turns":0,"rendered":""}}"#;

async fn fixed() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], BODY)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9090".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, Router::new().fallback(fixed)).await
}
