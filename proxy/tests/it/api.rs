//! REST conformance: the behaviour Toxiproxy's own API tests check (listing,
//! creating, populate, conflicts, enable/disable, delete, toxics, reset,
//! version, invalid input, browsers), against the embedded server.

use crate::support::*;
use serde_json::{json, Value};

fn names(list: &Value) -> Vec<String> {
    list.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn index_with_no_proxies_is_empty() {
    bounded(async {
        let s = server().await;
        let (status, v) = call(&s.url(), "GET", "/proxies", None).await;
        assert_eq!((status, v), (200, json!({})));
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn create_reports_bound_port_and_lists() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let body = format!(r#"{{"name":"mysql","listen":"127.0.0.1:0","upstream":"{up}"}}"#);
        let (status, v) = call(&s.url(), "POST", "/proxies", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        let listen: std::net::SocketAddr = v["listen"].as_str().unwrap().parse().unwrap();
        assert_ne!(listen.port(), 0);
        assert_eq!(v["enabled"], true);
        assert_eq!(v["upstream"], up.to_string());
        assert_eq!(v["toxics"], json!([]));
        assert!(accepts(listen).await);
        let (_, all) = call(&s.url(), "GET", "/proxies", None).await;
        assert_eq!(all["mysql"], v);
        let (status, one) = call(&s.url(), "GET", "/proxies/mysql", None).await;
        assert_eq!((status, one), (200, v));
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn create_with_blank_name_or_upstream_is_400() {
    bounded(async {
        let s = server().await;
        for (body, field) in [
            (r#"{"upstream":"127.0.0.1:1"}"#, "name"),
            (r#"{"name":"","upstream":"127.0.0.1:1"}"#, "name"),
            (r#"{"name":"x"}"#, "upstream"),
            (r#"{"name":"x","upstream":""}"#, "upstream"),
        ] {
            let (status, v) = call(&s.url(), "POST", "/proxies", Some(body)).await;
            assert_eq!(status, 400, "{body}");
            assert_eq!(v["status"], 400);
            let msg = v["error"].as_str().unwrap();
            assert_eq!(msg, format!("missing required field: {field}"));
        }
        let (status, v) = call(&s.url(), "POST", "/proxies", Some("{nope")).await;
        assert_eq!(status, 400);
        assert!(v["error"].as_str().unwrap().starts_with("bad request body"));
        assert_eq!(call(&s.url(), "GET", "/proxies", None).await.1, json!({}));
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn name_and_port_conflicts() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let listen = make_proxy(&s.url(), "a", up).await;
        let dup = format!(r#"{{"name":"a","listen":"127.0.0.1:0","upstream":"{up}"}}"#);
        let (status, v) = call(&s.url(), "POST", "/proxies", Some(&dup)).await;
        assert_eq!((status, v["error"].clone()), (409, json!("proxy already exists")));
        let clash = format!(r#"{{"name":"b","listen":"{listen}","upstream":"{up}"}}"#);
        let (status, v) = call(&s.url(), "POST", "/proxies", Some(&clash)).await;
        assert_eq!(status, 500, "{v}");
        assert!(v["error"].as_str().unwrap().contains(&listen.to_string()), "{v}");
        let (status, _) = call(&s.url(), "GET", "/proxies/b", None).await;
        assert_eq!(status, 404, "a failed create leaves nothing behind");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn disabled_proxy_refuses_until_enabled() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        // Disable (POST, Toxiproxy's classic verb) keeps the address.
        let (status, v) = call(&s.url(), "POST", "/proxies/p", Some(r#"{"enabled":false}"#)).await;
        assert_eq!(status, 200);
        assert_eq!((v["enabled"].clone(), v["listen"].clone()), (json!(false), json!(listen.to_string())));
        assert!(!accepts(listen).await);
        // Re-enable with PATCH, on the same port.
        let (status, v) = call(&s.url(), "PATCH", "/proxies/p", Some(r#"{"enabled":true}"#)).await;
        assert_eq!((status, v["enabled"].clone()), (200, json!(true)));
        assert_eq!(v["upstream"], up.to_string(), "unspecified fields are kept");
        assert!(accepts(listen).await);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn create_disabled_then_enable() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let body = format!(r#"{{"name":"d","listen":"127.0.0.1:0","upstream":"{up}","enabled":false}}"#);
        let (status, v) = call(&s.url(), "POST", "/proxies", Some(&body)).await;
        assert_eq!((status, v["enabled"].clone()), (201, json!(false)));
        let (_, v) = call(&s.url(), "POST", "/proxies/d", Some(r#"{"enabled":true}"#)).await;
        let listen: std::net::SocketAddr = v["listen"].as_str().unwrap().parse().unwrap();
        assert_ne!(listen.port(), 0);
        assert!(accepts(listen).await);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn update_changes_upstream_and_keeps_listen() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let other = echo_upstream().await;
        let listen = make_proxy(&s.url(), "u", up).await;
        let body = format!(r#"{{"upstream":"{other}"}}"#);
        let (status, v) = call(&s.url(), "POST", "/proxies/u", Some(&body)).await;
        assert_eq!(status, 200);
        assert_eq!(v["upstream"], other.to_string());
        assert_eq!(v["listen"], listen.to_string());
        assert_eq!(v["enabled"], true);
        assert!(accepts(listen).await);
        let (status, _) = call(&s.url(), "POST", "/proxies/nope", Some("{}")).await;
        assert_eq!(status, 404);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn delete_proxy_closes_it() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let listen = make_proxy(&s.url(), "gone", up).await;
        let (status, v) = call(&s.url(), "DELETE", "/proxies/gone", None).await;
        assert_eq!((status, v), (204, Value::Null));
        assert!(!accepts(listen).await);
        assert_eq!(call(&s.url(), "GET", "/proxies", None).await.1, json!({}));
        let (status, v) = call(&s.url(), "DELETE", "/proxies/gone", None).await;
        assert_eq!((status, v), (404, json!({"error": "proxy not found", "status": 404})));
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn populate_creates_new_proxies() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let body = format!(
            r#"[{{"name":"one","listen":"127.0.0.1:0","upstream":"{up}"}},
                {{"name":"two","listen":"127.0.0.1:0","upstream":"{up}"}}]"#
        );
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        assert_eq!(names(&v["proxies"]), ["one", "two"]);
        for p in v["proxies"].as_array().unwrap() {
            assert_eq!(p["enabled"], true);
            assert!(accepts(p["listen"].as_str().unwrap().parse().unwrap()).await);
        }
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn populate_keeps_identical_existing_proxy_and_its_toxics() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let listen = make_proxy(&s.url(), "keep", up).await;
        add_toxic(&s.url(), "keep", r#"{"type":"latency","attributes":{"latency":10}}"#).await;
        let mut sock = step("connect", tokio::net::TcpStream::connect(listen)).await.unwrap();
        let body = format!(r#"[{{"name":"keep","listen":"{listen}","upstream":"{up}"}}]"#);
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        assert_eq!(names(&v["proxies"][0]["toxics"]), ["latency_downstream"]);
        let (_, toxics) = call(&s.url(), "GET", "/proxies/keep/toxics", None).await;
        assert_eq!(names(&toxics), ["latency_downstream"]);
        round_trip(&mut sock, b"still connected").await;
        // A different upstream replaces the proxy, and its toxics go with it.
        let other = echo_upstream().await;
        let body = format!(r#"[{{"name":"keep","listen":"{listen}","upstream":"{other}"}}]"#);
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        assert_eq!(v["proxies"][0]["toxics"], json!([]));
        assert_eq!(v["proxies"][0]["upstream"], other.to_string());
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn populate_disabled_entry_is_created_disabled() {
    bounded(async {
        let s = server().await;
        let body = r#"[{"name":"off","listen":"127.0.0.1:0","upstream":"127.0.0.1:1","enabled":false}]"#;
        let (status, v) = call(&s.url(), "POST", "/populate", Some(body)).await;
        assert_eq!(status, 201, "{v}");
        assert_eq!(v["proxies"][0]["enabled"], false);
        let (_, p) = call(&s.url(), "GET", "/proxies/off", None).await;
        assert_eq!(p["enabled"], false);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn populate_with_bad_data_creates_nothing() {
    bounded(async {
        let s = server().await;
        let cases = [
            (r#"[{"name":"ok","upstream":"127.0.0.1:1"},{"name":"bad"}]"#, "upstream at proxy 2"),
            (r#"[{"name":"ok","upstream":"127.0.0.1:1"},{"upstream":"127.0.0.1:1"}]"#, "name at proxy 2"),
            (r#"[{"name":"ok","upstream":"127.0.0.1:1"},{"name":5,"upstream":"x:1"}]"#, "name"),
            (r#"{"name":"ok","upstream":"127.0.0.1:1"}"#, "array"),
            (r#"[{"name":"ok""#, "bad request body"),
        ];
        for (body, msg) in cases {
            let (status, v) = call(&s.url(), "POST", "/populate", Some(body)).await;
            assert_eq!(status, 400, "{body}: {v}");
            assert!(v["error"].as_str().unwrap().contains(msg), "{body}: {v}");
            assert_eq!(call(&s.url(), "GET", "/proxies", None).await.1, json!({}), "{body}");
        }
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn toxics_add_show_update_remove() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        make_proxy(&s.url(), "t", up).await;
        let (_, empty) = call(&s.url(), "GET", "/proxies/t/toxics", None).await;
        assert_eq!(empty, json!([]));
        let v = add_toxic(&s.url(), "t", r#"{"type":"latency","attributes":{"latency":100,"jitter":10}}"#).await;
        let expected = json!({"name":"latency_downstream","type":"latency","stream":"downstream",
            "toxicity":1.0,"attributes":{"latency":100,"jitter":10}});
        assert_eq!(v, expected);
        let (status, shown) = call(&s.url(), "GET", "/proxies/t/toxics/latency_downstream", None).await;
        assert_eq!((status, shown), (200, expected.clone()));
        let (_, p) = call(&s.url(), "GET", "/proxies/t", None).await;
        assert_eq!(p["toxics"], json!([expected]));
        // Update merges: jitter is kept, toxicity alone can change.
        let path = "/proxies/t/toxics/latency_downstream";
        let (status, v) = call(&s.url(), "POST", path, Some(r#"{"attributes":{"latency":1000}}"#)).await;
        assert_eq!(status, 200);
        assert_eq!(v["attributes"], json!({"latency":1000,"jitter":10}));
        let (status, v) = call(&s.url(), "PATCH", path, Some(r#"{"toxicity":0.5}"#)).await;
        assert_eq!(status, 200);
        assert_eq!((v["toxicity"].clone(), v["attributes"]["latency"].clone()), (json!(0.5), json!(1000)));
        let (status, _) = call(&s.url(), "DELETE", path, None).await;
        assert_eq!(status, 204);
        let (status, v) = call(&s.url(), "GET", path, None).await;
        assert_eq!((status, v["error"].clone()), (404, json!("toxic not found")));
        let (status, _) = call(&s.url(), "DELETE", path, None).await;
        assert_eq!(status, 404);
        let (status, _) = call(&s.url(), "POST", path, Some("{}")).await;
        assert_eq!(status, 404);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn toxics_of_unknown_proxy_are_404() {
    bounded(async {
        let s = server().await;
        for (method, path, body) in [
            ("GET", "/proxies/none/toxics", None),
            ("POST", "/proxies/none/toxics", Some(r#"{"type":"noop"}"#)),
            ("GET", "/proxies/none/toxics/x", None),
            ("DELETE", "/proxies/none/toxics/x", None),
        ] {
            let (status, v) = call(&s.url(), method, path, body).await;
            assert_eq!((status, v["error"].clone()), (404, json!("proxy not found")), "{method} {path}");
        }
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn conflicting_toxic_names_per_stream() {
    bounded(async {
        let s = server().await;
        make_proxy(&s.url(), "c", echo_upstream().await).await;
        let url = s.url();
        // Default names differ by stream, so both are accepted.
        add_toxic(&url, "c", r#"{"type":"latency","stream":"upstream","attributes":{"latency":1}}"#).await;
        add_toxic(&url, "c", r#"{"type":"latency","stream":"downstream","attributes":{"latency":1}}"#).await;
        // Same default name on the same stream: conflict.
        let again = r#"{"type":"latency","stream":"upstream","attributes":{"latency":1}}"#;
        let (status, v) = call(&url, "POST", "/proxies/c/toxics", Some(again)).await;
        assert_eq!((status, v["error"].clone()), (409, json!("toxic already exists")));
        // An explicit name is unique across both streams.
        add_toxic(&url, "c", r#"{"name":"foo","type":"noop","stream":"upstream"}"#).await;
        let clash = r#"{"name":"foo","type":"noop","stream":"downstream"}"#;
        let (status, _) = call(&url, "POST", "/proxies/c/toxics", Some(clash)).await;
        assert_eq!(status, 409);
        let (_, list) = call(&url, "GET", "/proxies/c/toxics", None).await;
        assert_eq!(names(&list), ["latency_upstream", "latency_downstream", "foo"]);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn toxicity_defaults_and_bounds() {
    bounded(async {
        let s = server().await;
        make_proxy(&s.url(), "x", echo_upstream().await).await;
        let v = add_toxic(&s.url(), "x", r#"{"type":"noop","toxicity":0.25}"#).await;
        assert_eq!(v["toxicity"], 0.25);
        for bad in [r#"{"type":"noop","name":"n2","toxicity":1.5}"#, r#"{"type":"noop","name":"n3","toxicity":-0.1}"#] {
            let (status, v) = call(&s.url(), "POST", "/proxies/x/toxics", Some(bad)).await;
            assert_eq!(status, 400);
            assert!(v["error"].as_str().unwrap().contains("toxicity"), "{v}");
        }
        let path = "/proxies/x/toxics/noop_downstream";
        let (status, _) = call(&s.url(), "POST", path, Some(r#"{"toxicity":2}"#)).await;
        assert_eq!(status, 400);
        assert_eq!(call(&s.url(), "GET", path, None).await.1["toxicity"], 0.25, "rejected update changed nothing");
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn invalid_toxics_are_400_naming_the_field_and_create_nothing() {
    bounded(async {
        let s = server().await;
        make_proxy(&s.url(), "v", echo_upstream().await).await;
        let cases = [
            (r#"{"type":"latency","stream":"sideways","attributes":{"latency":1}}"#, "stream"),
            (r#"{"type":"earthquake"}"#, "invalid toxic type"),
            (r#"{"attributes":{}}"#, "invalid toxic type"),
            (r#"{"type":"latency","attributes":{"latency":-5}}"#, "latency"),
            (r#"{"type":"bandwidth","attributes":{"rate":1.5}}"#, "rate"),
            (r#"{"type":"reset_peer","attributes":{"timeout":"soon"}}"#, "timeout"),
            (r#"{"type":"limit_data","attributes":{"bytes":-1}}"#, "bytes"),
            (r#"{"type":"latency","attributes":[1]}"#, "attributes"),
            (r#"{"type":"latency""#, "bad request body"),
        ];
        for (body, field) in cases {
            let (status, v) = call(&s.url(), "POST", "/proxies/v/toxics", Some(body)).await;
            assert_eq!(status, 400, "{body}: {v}");
            assert_eq!(v["status"], 400);
            assert!(v["error"].as_str().unwrap().contains(field), "{body}: {v}");
        }
        assert_eq!(call(&s.url(), "GET", "/proxies/v/toxics", None).await.1, json!([]));
        // Bad updates are rejected too and leave the toxic as it was.
        add_toxic(&s.url(), "v", r#"{"type":"latency","attributes":{"latency":7}}"#).await;
        let path = "/proxies/v/toxics/latency_downstream";
        let (status, v) = call(&s.url(), "POST", path, Some(r#"{"attributes":{"jitter":-1}}"#)).await;
        assert_eq!(status, 400);
        assert!(v["error"].as_str().unwrap().contains("jitter"));
        assert_eq!(call(&s.url(), "GET", path, None).await.1["attributes"]["latency"], 7);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn reset_enables_everything_and_removes_toxics() {
    bounded(async {
        let s = server().await;
        let up = echo_upstream().await;
        let a = make_proxy(&s.url(), "a", up).await;
        make_proxy(&s.url(), "b", up).await;
        add_toxic(&s.url(), "a", r#"{"type":"latency","attributes":{"latency":100,"jitter":10}}"#).await;
        add_toxic(&s.url(), "b", r#"{"type":"timeout","stream":"upstream","attributes":{"timeout":0}}"#).await;
        call(&s.url(), "POST", "/proxies/a", Some(r#"{"enabled":false}"#)).await;
        assert!(!accepts(a).await);
        let (status, v) = call(&s.url(), "POST", "/reset", None).await;
        assert_eq!((status, v), (204, Value::Null));
        let (_, all) = call(&s.url(), "GET", "/proxies", None).await;
        for name in ["a", "b"] {
            assert_eq!(all[name]["enabled"], true);
            assert_eq!(all[name]["toxics"], json!([]));
        }
        assert!(accepts(a).await);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn version_is_json() {
    bounded(async {
        let s = server().await;
        let (status, v) = call(&s.url(), "GET", "/version", None).await;
        assert_eq!(status, 200);
        assert_eq!(v["version"], proxy::VERSION);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn browsers_are_refused_in_plain_text() {
    bounded(async {
        let s = server().await;
        let ua = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36";
        for (method, path) in [("GET", "/proxies"), ("GET", "/version"), ("POST", "/reset")] {
            let answer = call_raw(&s.url(), method, path, None, ua).await;
            assert_eq!((answer.status, answer.body.as_str()), (403, "User agent not allowed\n"), "{method} {path}");
        }
        let answer = call_raw(&s.url(), "GET", "/proxies", None, "curl/8.0").await;
        assert_eq!(answer.status, 200);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn unknown_routes_answer_go_style_plain_text() {
    bounded(async {
        let s = server().await;
        let answer = call_raw(&s.url(), "GET", "/nothing/here", None, "t").await;
        assert_eq!((answer.status, answer.body.as_str()), (404, "404 page not found\n"));
        assert!(answer.content_type.starts_with("text/plain"), "{}", answer.content_type);
        let answer = call_raw(&s.url(), "PUT", "/proxies", None, "t").await;
        assert_eq!(answer.status, 405);
        assert!(answer.body.contains("method not allowed"), "{}", answer.body);
        s.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn shutdown_leaves_nothing_listening() {
    bounded(async {
        let s = server().await;
        let api = s.addr();
        let up = echo_upstream().await;
        let listen = make_proxy(&s.url(), "p", up).await;
        let mut sock = step("connect", tokio::net::TcpStream::connect(listen)).await.unwrap();
        round_trip(&mut sock, b"hi").await;
        step("shutdown", s.shutdown()).await;
        assert!(!accepts(api).await, "API still listening");
        assert!(!accepts(listen).await, "proxy still listening");
        let (_, _) = step("connection closed", read_to_end(&mut sock)).await;
    })
    .await;
}
