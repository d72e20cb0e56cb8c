//! Conformance with Toxiproxy's `api_test.go`: every case of it, each test
//! named after the upstream test it mirrors (`TestCreateProxyBlankName` →
//! `create_proxy_blank_name`), run against the embedded server over real TCP.
//! Requests have the shapes Toxiproxy's Go client sends (see `go_proxy` and
//! `go_toxic`). Where the upstream test binds fixed ports (`localhost:3310`),
//! these bind a free loopback port, still named `localhost:P`.

use crate::support::*;
use serde_json::{json, Value};

/// A proxy created the way the Go client's `CreateProxy` does; answers the body.
async fn create(base: &str, name: &str, listen: &str, upstream: &str) -> Value {
    let (status, v) = call(base, "POST", "/proxies", Some(&go_proxy(name, listen, upstream, true))).await;
    assert_eq!(status, 201, "{v}");
    v
}

async fn toxics_of(base: &str, proxy: &str) -> Value {
    let (status, v) = call(base, "GET", &format!("/proxies/{proxy}/toxics"), None).await;
    assert_eq!(status, 200, "{v}");
    v
}

fn localhost() -> String {
    format!("localhost:{}", free_port())
}

/// `localhost:P` as Toxiproxy reports it once bound.
fn bound(listen: &str) -> String {
    listen.replace("localhost", "127.0.0.1")
}

/// Mirrors TestRequestId: every answer carries `X-Toxiproxy-Request-Id`.
#[tokio::test]
async fn request_id() {
    bounded(async {
        let s = server().await;
        let answer = call_raw(&s.url(), "GET", "/version", None, "curl").await;
        assert!(answer.request_id.is_some_and(|id| !id.is_empty()));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestBrowserGets403.
#[tokio::test]
async fn browser_gets403() {
    bounded(async {
        let s = server().await;
        let ua = "Mozilla/5.0 (Linux; Android 4.4.2); Nexus 5 Build/KOT49H) AppleWebKit/537.36";
        assert_eq!(call_raw(&s.url(), "GET", "/proxies", None, ua).await.status, 403);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestNonBrowserGets200.
#[tokio::test]
async fn non_browser_gets200() {
    bounded(async {
        let s = server().await;
        assert_eq!(call_raw(&s.url(), "GET", "/proxies", None, "Wget/2.1").await.status, 200);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestIndexWithNoProxies.
#[tokio::test]
async fn index_with_no_proxies() {
    bounded(async {
        let s = server().await;
        assert_eq!(call(&s.url(), "GET", "/proxies", None).await, (200, json!({})));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestCreateProxyBlankName.
#[tokio::test]
async fn create_proxy_blank_name() {
    bounded(async {
        let s = server().await;
        let (status, v) = call(&s.url(), "POST", "/proxies", Some(&go_proxy("", "", "", true))).await;
        assert_eq!((status, v["error"].clone()), (400, json!("missing required field: name")));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestCreateProxyBlankUpstream.
#[tokio::test]
async fn create_proxy_blank_upstream() {
    bounded(async {
        let s = server().await;
        let (status, v) = call(&s.url(), "POST", "/proxies", Some(&go_proxy("test", "", "", true))).await;
        assert_eq!((status, v["error"].clone()), (400, json!("missing required field: upstream")));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestPopulateProxy.
#[tokio::test]
async fn populate_proxy() {
    bounded(async {
        let s = server().await;
        let (one, two) = (localhost(), localhost());
        let body = format!(
            "[{},{}]",
            go_proxy("one", &one, "localhost:7171", true),
            go_proxy("two", &two, "localhost:7474", true)
        );
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        let proxies = v["proxies"].as_array().unwrap();
        assert_eq!((proxies.len(), &proxies[0]["name"], &proxies[1]["name"]), (2, &json!("one"), &json!("two")));
        for p in proxies {
            assert!(up(p["listen"].as_str().unwrap()).await, "{p}");
        }
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestPopulateDefaultEnabled: an entry without `enabled` is enabled.
#[tokio::test]
async fn populate_default_enabled() {
    bounded(async {
        let s = server().await;
        let listen = localhost();
        let body = format!(r#"[{{"name": "test", "listen": "{listen}", "upstream": "localhost:7171"}}]"#);
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        let (_, all) = call(&s.url(), "GET", "/proxies", None).await;
        assert_eq!(all.as_object().unwrap().len(), 1);
        assert!(up(all["test"]["listen"].as_str().unwrap()).await);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestPopulateDisabledProxy.
#[tokio::test]
async fn populate_disabled_proxy() {
    bounded(async {
        let s = server().await;
        let (one, two) = (localhost(), localhost());
        let body = format!(
            "[{},{}]",
            go_proxy("one", &one, "localhost:7171", false),
            go_proxy("two", &two, "localhost:7474", true)
        );
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        assert_eq!((v["proxies"][0]["name"].clone(), v["proxies"][1]["name"].clone()), (json!("one"), json!("two")));
        assert!(!up(&one).await);
        assert!(up(&two).await);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestPopulateExistingProxy: `127.0.0.1:P` with the same upstream is
/// the proxy created as `localhost:P`, kept with its toxic; another upstream
/// replaces the proxy.
#[tokio::test]
async fn populate_existing_proxy() {
    bounded(async {
        let s = server().await;
        let (one, two, three) = (localhost(), localhost(), free_port());
        create(&s.url(), "one", &one, "localhost:7171").await;
        create(&s.url(), "two", &two, "localhost:7474").await;
        let (status, _) = go_add_toxic(&s.url(), "one", &go_toxic("", "latency", "downstream", 1.0, Value::Null)).await;
        assert_eq!(status, 200);
        let body = format!(
            "[{},{}]",
            go_proxy("one", &bound(&one), "localhost:7171", true),
            go_proxy("two", &format!("127.0.0.1:{three}"), "localhost:7676", true)
        );
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        assert_eq!(v["proxies"][0]["listen"], bound(&one));
        assert_eq!(v["proxies"][1]["listen"], format!("127.0.0.1:{three}"));
        let toxics = toxics_of(&s.url(), "one").await;
        assert_eq!(toxics.as_array().unwrap().len(), 1, "populate did not keep proxy one: {toxics}");
        assert_eq!(toxics[0]["type"], "latency");
        for p in v["proxies"].as_array().unwrap() {
            assert!(up(p["listen"].as_str().unwrap()).await);
        }
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestPopulateWithBadName: nothing is created.
#[tokio::test]
async fn populate_with_bad_name() {
    bounded(async {
        let s = server().await;
        let body =
            format!("[{},{}]", go_proxy("one", &localhost(), "localhost:7171", true), go_proxy("", "", "", true));
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!((status, v["error"].clone()), (400, json!("missing required field: name at proxy 2")));
        assert_eq!(call(&s.url(), "GET", "/proxies", None).await.1, json!({}));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestPopulateProxyWithBadDataShouldReturnError: the entry that
/// cannot listen fails the request; the one before it stays created.
#[tokio::test]
async fn populate_proxy_with_bad_data_should_return_error() {
    bounded(async {
        let s = server().await;
        let body = format!(
            "[{},{},{}]",
            go_proxy("one", &localhost(), "localhost:7171", true),
            go_proxy("two", "local373", "localhost:7474", true),
            go_proxy("three", &localhost(), "localhost:7676", true)
        );
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert!(status >= 400, "{status} {v}");
        assert!(v["error"].as_str().unwrap().contains("local373"), "{v}");
        let (_, all) = call(&s.url(), "GET", "/proxies", None).await;
        let names: Vec<&String> = all.as_object().unwrap().keys().collect();
        assert_eq!(names, ["one"]);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestPopulateAddToxic.
#[tokio::test]
async fn populate_add_toxic() {
    bounded(async {
        let s = server().await;
        let body = format!("[{}]", go_proxy("one", &localhost(), "localhost:7171", true));
        let (status, v) = call(&s.url(), "POST", "/populate", Some(&body)).await;
        assert_eq!(status, 201, "{v}");
        let (status, v) = go_add_toxic(&s.url(), "one", &go_toxic("", "latency", "downstream", 1.0, Value::Null)).await;
        assert_eq!(status, 200, "{v}");
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestListingProxies: `localhost:P` is reported bound, as `127.0.0.1:P`.
#[tokio::test]
async fn listing_proxies() {
    bounded(async {
        let s = server().await;
        let listen = localhost();
        create(&s.url(), "mysql_master", &listen, "localhost:20001").await;
        let (_, all) = call(&s.url(), "GET", "/proxies", None).await;
        let p = &all["mysql_master"];
        assert_eq!((p["name"].clone(), p["listen"].clone()), (json!("mysql_master"), json!(bound(&listen))));
        assert_eq!((p["upstream"].clone(), p["toxics"].clone()), (json!("localhost:20001"), json!([])));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestCreateAndGetProxy.
#[tokio::test]
async fn create_and_get_proxy() {
    bounded(async {
        let s = server().await;
        let listen = localhost();
        create(&s.url(), "mysql_master", &listen, "localhost:20001").await;
        let (status, p) = call(&s.url(), "GET", "/proxies/mysql_master", None).await;
        assert_eq!(status, 200);
        assert_eq!((p["listen"].clone(), p["enabled"].clone()), (json!(bound(&listen)), json!(true)));
        assert_eq!(p["toxics"], json!([]));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestCreateProxyWithSave: the Go client's `Save` of a new proxy.
#[tokio::test]
async fn create_proxy_with_save() {
    bounded(async {
        let s = server().await;
        let listen = localhost();
        create(&s.url(), "mysql_master", &listen, "localhost:20001").await;
        let (_, p) = call(&s.url(), "GET", "/proxies/mysql_master", None).await;
        assert_eq!((p["listen"].clone(), p["enabled"].clone()), (json!(bound(&listen)), json!(true)));
        assert!(up(p["listen"].as_str().unwrap()).await);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestCreateDisabledProxy: never bound, so `listen` stays as given.
#[tokio::test]
async fn create_disabled_proxy() {
    bounded(async {
        let s = server().await;
        let listen = localhost();
        let (status, _) =
            call(&s.url(), "POST", "/proxies", Some(&go_proxy("mysql_master", &listen, "localhost:20001", false)))
                .await;
        assert_eq!(status, 201);
        let (_, p) = call(&s.url(), "GET", "/proxies/mysql_master", None).await;
        assert_eq!((p["listen"].clone(), p["enabled"].clone()), (json!(listen), json!(false)));
        assert!(!up(&listen).await);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestCreateDisabledProxyAndEnable: the Go client's `Save` of an
/// existing proxy posts the whole proxy (toxics included) to `/proxies/{name}`.
#[tokio::test]
async fn create_disabled_proxy_and_enable() {
    bounded(async {
        let s = server().await;
        let listen = localhost();
        call(&s.url(), "POST", "/proxies", Some(&go_proxy("mysql_master", &listen, "localhost:20001", false))).await;
        let (_, mut p) = call(&s.url(), "GET", "/proxies/mysql_master", None).await;
        assert_eq!(p["enabled"], false);
        p["enabled"] = json!(true);
        let (status, saved) = call(&s.url(), "POST", "/proxies/mysql_master", Some(&p.to_string())).await;
        assert_eq!(status, 200, "{saved}");
        assert!(up(&listen).await);
        let mut p = saved;
        p["enabled"] = json!(false);
        let (status, _) = call(&s.url(), "POST", "/proxies/mysql_master", Some(&p.to_string())).await;
        assert_eq!(status, 200);
        assert!(!up(&listen).await);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestDeleteProxy.
#[tokio::test]
async fn delete_proxy() {
    bounded(async {
        let s = server().await;
        let listen = localhost();
        create(&s.url(), "mysql_master", &listen, "localhost:20001").await;
        assert!(up(&listen).await);
        assert_eq!(call(&s.url(), "DELETE", "/proxies/mysql_master", None).await.0, 204);
        assert!(!up(&listen).await);
        assert_eq!(call(&s.url(), "GET", "/proxies", None).await.1, json!({}));
        let (status, v) = call(&s.url(), "DELETE", "/proxies/mysql_master", None).await;
        assert_eq!((status, v["error"].clone()), (404, json!("proxy not found")));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestCreateProxyPortConflict, message included.
#[tokio::test]
async fn create_proxy_port_conflict() {
    bounded(async {
        let s = server().await;
        let listen = localhost();
        create(&s.url(), "mysql_master", &listen, "localhost:20001").await;
        let (status, v) =
            call(&s.url(), "POST", "/proxies", Some(&go_proxy("test", &listen, "localhost:20001", true))).await;
        let expected = format!("listen tcp {}: bind: address already in use", bound(&listen));
        assert_eq!((status, v["error"].clone()), (500, json!(expected)));
        call(&s.url(), "DELETE", "/proxies/mysql_master", None).await;
        create(&s.url(), "test", &listen, "localhost:20001").await;
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestCreateProxyNameConflict.
#[tokio::test]
async fn create_proxy_name_conflict() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        let other = localhost();
        let body = go_proxy("mysql_master", &other, "localhost:20001", true);
        let (status, v) = call(&s.url(), "POST", "/proxies", Some(&body)).await;
        assert_eq!((status, v["error"].clone()), (409, json!("proxy already exists")));
        call(&s.url(), "DELETE", "/proxies/mysql_master", None).await;
        create(&s.url(), "mysql_master", &other, "localhost:20001").await;
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestResetState.
#[tokio::test]
async fn reset_state() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        let body = go_toxic("", "latency", "downstream", 1.0, json!({"latency": 100, "jitter": 10}));
        let (_, t) = go_add_toxic(&s.url(), "mysql_master", &body).await;
        assert_eq!(t["attributes"], json!({"latency": 100, "jitter": 10}));
        assert_eq!(call(&s.url(), "POST", "/reset", None).await.0, 204);
        let (_, all) = call(&s.url(), "GET", "/proxies", None).await;
        let p = &all["mysql_master"];
        assert_eq!((p["enabled"].clone(), p["toxics"].clone()), (json!(true), json!([])));
        assert!(up(p["listen"].as_str().unwrap()).await);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestListingToxics.
#[tokio::test]
async fn listing_toxics() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        assert_eq!(toxics_of(&s.url(), "mysql_master").await, json!([]));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestAddToxic.
#[tokio::test]
async fn add_toxic() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        let body = go_toxic("foobar", "latency", "downstream", 1.0, json!({"latency": 100, "jitter": 10}));
        let (status, t) = go_add_toxic(&s.url(), "mysql_master", &body).await;
        assert_eq!(status, 200, "{t}");
        let toxics = toxics_of(&s.url(), "mysql_master").await;
        let t = toxic_named(&toxics, "foobar").expect("foobar listed");
        assert_eq!(
            (t["type"].clone(), t["stream"].clone(), t["toxicity"].clone()),
            (json!("latency"), json!("downstream"), json!(1.0))
        );
        assert_eq!(t["attributes"], json!({"latency": 100, "jitter": 10}));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestAddMultipleToxics: `nil` attributes are zero attributes.
#[tokio::test]
async fn add_multiple_toxics() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        for name in ["latency1", "latency2"] {
            let (status, v) =
                go_add_toxic(&s.url(), "mysql_master", &go_toxic(name, "latency", "downstream", 1.0, Value::Null))
                    .await;
            assert_eq!(status, 200, "{v}");
        }
        let toxics = toxics_of(&s.url(), "mysql_master").await;
        assert_eq!(toxics.as_array().unwrap().len(), 2);
        let t = toxic_named(&toxics, "latency2").unwrap();
        assert_eq!((t["toxicity"].clone(), t["attributes"].clone()), (json!(1.0), json!({"latency": 0, "jitter": 0})));
        assert!(toxics.as_array().unwrap().iter().all(|t| t["stream"] == "downstream"));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestAddConflictingToxic.
#[tokio::test]
async fn add_conflicting_toxic() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        go_add_toxic(&s.url(), "mysql_master", &go_toxic("foobar", "latency", "downstream", 1.0, Value::Null)).await;
        let body = go_toxic("foobar", "slow_close", "downstream", 1.0, Value::Null);
        let (status, v) = go_add_toxic(&s.url(), "mysql_master", &body).await;
        assert_eq!((status, v["error"].clone()), (409, json!("toxic already exists")));
        let toxics = toxics_of(&s.url(), "mysql_master").await;
        assert_eq!(toxics.as_array().unwrap().len(), 1);
        assert_eq!(toxic_named(&toxics, "foobar").unwrap()["type"], "latency");
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestAddConflictingToxicsMultistream: names are unique across streams.
#[tokio::test]
async fn add_conflicting_toxics_multistream() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        go_add_toxic(&s.url(), "mysql_master", &go_toxic("foobar", "latency", "upstream", 1.0, Value::Null)).await;
        let body = go_toxic("foobar", "latency", "downstream", 1.0, Value::Null);
        let (status, v) = go_add_toxic(&s.url(), "mysql_master", &body).await;
        assert_eq!((status, v["error"].clone()), (409, json!("toxic already exists")));
        let toxics = toxics_of(&s.url(), "mysql_master").await;
        assert_eq!(toxics.as_array().unwrap().len(), 1);
        assert_eq!(toxic_named(&toxics, "foobar").unwrap()["stream"], "upstream");
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestAddConflictingToxicsMultistreamDefaults: default names differ by stream.
#[tokio::test]
async fn add_conflicting_toxics_multistream_defaults() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        for stream in ["upstream", "downstream"] {
            let (status, v) =
                go_add_toxic(&s.url(), "mysql_master", &go_toxic("", "latency", stream, 1.0, Value::Null)).await;
            assert_eq!(status, 200, "{v}");
        }
        let toxics = toxics_of(&s.url(), "mysql_master").await;
        for stream in ["upstream", "downstream"] {
            let t = toxic_named(&toxics, &format!("latency_{stream}")).expect("default name");
            assert_eq!(
                (t["stream"].clone(), t["attributes"].clone()),
                (json!(stream), json!({"latency": 0, "jitter": 0}))
            );
        }
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestAddToxicWithToxicity.
#[tokio::test]
async fn add_toxic_with_toxicity() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        let body = go_toxic("", "latency", "downstream", 0.2, json!({"latency": 100, "jitter": 10}));
        let (_, t) = go_add_toxic(&s.url(), "mysql_master", &body).await;
        assert_eq!(t["toxicity"], json!(0.2));
        let toxics = toxics_of(&s.url(), "mysql_master").await;
        let t = toxic_named(&toxics, "latency_downstream").unwrap();
        assert_eq!((t["toxicity"].clone(), t["attributes"]["latency"].clone()), (json!(0.2), json!(100)));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestAddNoop: no stream given means downstream.
#[tokio::test]
async fn add_noop() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        let (status, t) =
            go_add_toxic(&s.url(), "mysql_master", &go_toxic("foobar", "noop", "", 1.0, Value::Null)).await;
        assert_eq!(status, 200, "{t}");
        assert_eq!(
            (t["name"].clone(), t["type"].clone(), t["stream"].clone()),
            (json!("foobar"), json!("noop"), json!("downstream"))
        );
        assert_eq!(t["toxicity"], json!(1.0));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestUpdateToxics: the Go client's `UpdateToxic` (PATCH, toxicity
/// left out when -1); unspecified attributes and toxicity are kept.
#[tokio::test]
async fn update_toxics() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        let body = go_toxic("", "latency", "downstream", -1.0, json!({"latency": 100, "jitter": 10}));
        let (_, t) = go_add_toxic(&s.url(), "mysql_master", &body).await;
        assert_eq!(t["toxicity"], json!(1.0));
        let path = "/proxies/mysql_master/toxics/latency_downstream";
        let (_, t) = call(&s.url(), "PATCH", path, Some(r#"{"attributes":{"latency":1000},"toxicity":0.5}"#)).await;
        assert_eq!(
            (t["toxicity"].clone(), t["attributes"].clone()),
            (json!(0.5), json!({"latency": 1000, "jitter": 10}))
        );
        let (_, t) = call(&s.url(), "PATCH", path, Some(r#"{"attributes":{"latency":500}}"#)).await;
        assert_eq!(
            (t["toxicity"].clone(), t["attributes"].clone()),
            (json!(0.5), json!({"latency": 500, "jitter": 10}))
        );
        let toxics = toxics_of(&s.url(), "mysql_master").await;
        assert_eq!(toxic_named(&toxics, "latency_downstream").unwrap(), &t);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestRemoveToxic.
#[tokio::test]
async fn remove_toxic() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        go_add_toxic(&s.url(), "mysql_master", &go_toxic("", "latency", "downstream", 1.0, Value::Null)).await;
        assert!(toxic_named(&toxics_of(&s.url(), "mysql_master").await, "latency_downstream").is_some());
        let (status, _) = call(&s.url(), "DELETE", "/proxies/mysql_master/toxics/latency_downstream", None).await;
        assert_eq!(status, 204);
        assert_eq!(toxics_of(&s.url(), "mysql_master").await, json!([]));
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestVersionEndpointReturnsVersion: Toxiproxy's exact body.
#[tokio::test]
async fn version_endpoint_returns_version() {
    bounded(async {
        let s = server().await;
        let answer = call_raw(&s.url(), "GET", "/version", None, "curl").await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, format!("{{\"version\": \"{}\"}}\n", proxy::VERSION));
        assert!(answer.content_type.starts_with("application/json"), "{}", answer.content_type);
        s.shutdown().await;
    })
    .await;
}

/// Mirrors TestInvalidStream.
#[tokio::test]
async fn invalid_stream() {
    bounded(async {
        let s = server().await;
        create(&s.url(), "mysql_master", &localhost(), "localhost:20001").await;
        let body = go_toxic("", "latency", "walrustream", 1.0, Value::Null);
        let (status, v) = go_add_toxic(&s.url(), "mysql_master", &body).await;
        assert_eq!(
            (status, v["error"].clone()),
            (400, json!("stream was invalid, can be either upstream or downstream"))
        );
        s.shutdown().await;
    })
    .await;
}
