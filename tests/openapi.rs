//! The checked-in spec is what the server serves. Regenerate it with
//! `cargo run -q -- openapi > openapi/openapi.json`.

use turnstore::{Application, Settings};

const CHECKED_IN: &str = include_str!("../openapi/openapi.json");

#[tokio::test]
async fn served_spec_matches_the_checked_in_file() {
    let settings = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Settings::default()
    };
    let app = Application::build(settings).await.expect("build");
    let url = format!("http://127.0.0.1:{}/openapi.json", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending::<()>()));

    let served: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    let checked_in: serde_json::Value = serde_json::from_str(CHECKED_IN).unwrap();

    assert!(
        served == checked_in,
        "openapi/openapi.json is stale: run `cargo run -q -- openapi > openapi/openapi.json`"
    );
}

#[test]
fn spec_names_every_operation() {
    let spec: serde_json::Value = serde_json::from_str(&turnstore::openapi_json()).unwrap();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut ids: Vec<String> = spec["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|p| p.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "abort_turn",
            "clear_session",
            "erase_user",
            "finalize_turn",
            "get_history",
            "get_session",
            "list_user_sessions",
            "start_turn",
        ]
    );
}
