//! The control API on a live VM: bad requests get 4xx with a JSON error
//! naming the field and leave the VM untouched; stalled and vanishing
//! clients block nobody; the metrics parse with a Prometheus parser; and
//! docs/api.yaml is walked against the server, both ways.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{Scratch, Vm};
use hover_vmm::api::{ApiClient, Endpoint};
use hover_vmm::host::kvm_for_test;

/// `method path body` must be refused with `status`, naming `field`.
fn refused(
    api: &ApiClient,
    method: &str,
    path: &str,
    body: &str,
    status: u16,
    field: Option<&str>,
) {
    let r = api.call(method, path, Some(body)).unwrap();
    assert_eq!(r.status, status, "{method} {path} {body}: {}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    if let Some(f) = field {
        assert_eq!(v["field"], f, "{method} {path} {body}: {v}");
    }
}

#[test]
fn bad_requests_are_refused_and_the_vm_runs_on() {
    if !kvm_for_test("bad_requests_are_refused_and_the_vm_runs_on") {
        return;
    }
    let dir = Scratch::new("api-bad");
    let vm = Vm::spawn(
        &["run", "--cmdline", "workload=spin tasks=2 seconds=600"],
        &dir.path("vm.sock"),
    );
    let mode = std::fs::metadata(&vm.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only the owner may steer the VM");
    let api = vm.api();
    let existing = dir.path("keep.txt");
    std::fs::write(&existing, "keep me").unwrap();
    let snap = |v: serde_json::Value| v.to_string();
    refused(&api, "PUT", "/vm/snapshot", "{not json", 400, Some("body"));
    refused(
        &api,
        "PUT",
        "/vm/snapshot",
        &snap(serde_json::json!({"path": "/x", "colour": 1})),
        400,
        Some("colour"),
    );
    refused(
        &api,
        "PUT",
        "/vm/snapshot",
        r#"{"stop": true}"#,
        400,
        Some("path"),
    );
    refused(
        &api,
        "PUT",
        "/vm/snapshot",
        r#"{"path": "/x", "stop": "yes"}"#,
        400,
        Some("stop"),
    );
    // A hot-set window past 10 s is refused, naming the field and the bound
    // (and no file is written).
    let long = dir.path("long.snap");
    refused(
        &api,
        "PUT",
        "/vm/snapshot",
        &snap(serde_json::json!({"path": long, "hot_window_ms": 10_001})),
        400,
        Some("hot_window_ms"),
    );
    assert!(
        !long.exists(),
        "a refused snapshot wrote {}",
        long.display()
    );
    refused(
        &api,
        "PUT",
        "/vm/snapshot",
        &snap(serde_json::json!({"path": existing})),
        409,
        Some("path"),
    );
    refused(
        &api,
        "PUT",
        "/vm/snapshot",
        r#"{"path": "/proc/no/such/dir/vm.snap"}"#,
        400,
        Some("path"),
    );
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    refused(
        &api,
        "PUT",
        "/vm/halt-poll",
        r#"{"mode": "fixed", "window_ns": 99999999999}"#,
        400,
        Some("window_ns"),
    );
    refused(
        &api,
        "PUT",
        "/vm/halt-poll",
        r#"{"mode": "auto", "budget_pct": 0}"#,
        400,
        Some("budget_pct"),
    );
    refused(
        &api,
        "PUT",
        "/vm/halt-poll",
        r#"{"mode": "often"}"#,
        400,
        Some("mode"),
    );
    refused(&api, "PUT", "/vm/pause", "xyz", 400, Some("body"));
    refused(&api, "PUT", "/vm/resume", "", 409, None);
    refused(&api, "GET", "/nope", "", 404, None);
    refused(&api, "DELETE", "/vm", "", 405, None);
    refused(&api, "GET", "/vm/pause", "", 405, None);

    // A huge body is refused before it is read.
    let mut s = UnixStream::connect(&vm.socket).unwrap();
    s.write_all(b"PUT /vm/snapshot HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = [0u8; 12];
    std::io::Read::read_exact(&mut s, &mut answer).unwrap();
    assert_eq!(
        &answer,
        b"HTTP/1.1 413",
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // Clients that send nothing, stop mid-body, or vanish mid-request...
    let _silent = UnixStream::connect(&vm.socket).unwrap();
    let mut half = UnixStream::connect(&vm.socket).unwrap();
    half.write_all(b"PUT /vm/snapshot HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pa")
        .unwrap();
    let mut gone = UnixStream::connect(&vm.socket).unwrap();
    gone.write_all(b"PUT /vm/pau").unwrap();
    drop(gone);
    // ...block neither the VM nor other clients.
    let t = Instant::now();
    let v = api.json("GET", "/vm", None).unwrap();
    assert_eq!(v["state"], "running");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    let v = api.json("PUT", "/vm/pause", None).unwrap();
    assert!(v["pause_us"].as_u64().is_some());
    api.json("PUT", "/vm/resume", None).unwrap();
    vm.shut_down();
}

#[test]
fn metrics_parse_with_a_prometheus_parser() {
    if !kvm_for_test("metrics_parse_with_a_prometheus_parser") {
        return;
    }
    let dir = Scratch::new("api-metrics");
    let vm = Vm::spawn(
        &[
            "run",
            "--memory",
            "64M",
            "--memory-budget",
            "32M",
            "--cmdline",
            "workload=spin tasks=2 seconds=600",
        ],
        &dir.path("vm.sock"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let r = vm.api().call("GET", "/metrics", None).unwrap();
    assert_eq!(r.status, 200);
    let lines = r.body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("a valid exposition");
    let sample = |name: &str, vcpu: Option<&str>| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && vcpu.is_none_or(|v| s.labels.get("vcpu") == Some(v)))
            .unwrap_or_else(|| panic!("no {name} {vcpu:?} in\n{}", r.body))
    };
    for v in ["0", "1"] {
        sample("hover_vcpu_halt_successful_poll_total", Some(v));
        sample("hover_vcpu_halt_attempted_poll_total", Some(v));
        // OpenMetrics names a counter's family without `_total`; this
        // parser (Prometheus 0.0.4 rules) then reads the sample as untyped.
        let exits = sample("hover_vcpu_exits_total", Some(v));
        assert!(
            matches!(exits.value, prometheus_parse::Value::Counter(n) | prometheus_parse::Value::Untyped(n) if n > 0.0),
            "{exits:?}"
        );
    }
    let up = sample("hover_up", None);
    assert!(
        matches!(up.value, prometheus_parse::Value::Gauge(g) if g == 1.0),
        "{up:?}"
    );
    assert!(
        scrape.docs.contains_key("hover_vcpu_exits"),
        "every family has its help text"
    );
    sample("hover_pager_faults_total", None);
    sample("hover_pager_resident_pages", None);
    vm.shut_down();
}

fn to_json(y: &yaml_rust2::Yaml) -> serde_json::Value {
    use yaml_rust2::Yaml;
    match y {
        Yaml::Real(s) => s
            .parse::<f64>()
            .map_or(serde_json::Value::Null, |f| f.into()),
        Yaml::Integer(i) => (*i).into(),
        Yaml::String(s) => s.clone().into(),
        Yaml::Boolean(b) => (*b).into(),
        Yaml::Array(a) => a.iter().map(to_json).collect(),
        Yaml::Hash(h) => h
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().map_or_else(|| format!("{k:?}"), str::to_string),
                    to_json(v),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
        _ => serde_json::Value::Null,
    }
}

/// Resolve a `$ref` within the document.
fn resolve<'a>(doc: &'a serde_json::Value, v: &'a serde_json::Value) -> &'a serde_json::Value {
    match v["$ref"].as_str() {
        Some(r) => r
            .trim_start_matches("#/")
            .split('/')
            .fold(doc, |node, key| &node[key]),
        None => v,
    }
}

/// `value` has every property `schema` requires, recursively through
/// object properties that are present.
fn check_schema(
    doc: &serde_json::Value,
    schema: &serde_json::Value,
    value: &serde_json::Value,
    at: &str,
) {
    let schema = resolve(doc, schema);
    for part in schema["allOf"].as_array().into_iter().flatten() {
        check_schema(doc, part, value, at);
    }
    for r in schema["required"].as_array().into_iter().flatten() {
        let k = r.as_str().unwrap();
        assert!(
            value.get(k).is_some(),
            "{at}: required property {k} missing in {value}"
        );
    }
    if schema["items"].is_object() {
        for (i, v) in value.as_array().into_iter().flatten().enumerate() {
            check_schema(doc, &schema["items"], v, &format!("{at}[{i}]"));
        }
    }
    if let Some(props) = schema["properties"].as_object() {
        for (k, s) in props {
            if let Some(v) = value.get(k).filter(|v| v.is_object() || v.is_array()) {
                check_schema(doc, s, v, &format!("{at}.{k}"));
            }
        }
        // Every field the server sends is documented (a map's keys are
        // free where the schema gives their type in additionalProperties).
        if !schema["additionalProperties"].is_object()
            && schema["additionalProperties"] != serde_json::Value::Bool(true)
        {
            for k in value.as_object().into_iter().flatten().map(|(k, _)| k) {
                assert!(
                    props.contains_key(k),
                    "{at}: property {k} is not documented in docs/api.yaml"
                );
            }
        }
    }
}

#[test]
fn api_yaml_matches_the_live_server() {
    if !kvm_for_test("api_yaml_matches_the_live_server") {
        return;
    }
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api.yaml"))
        .expect("docs/api.yaml");
    let doc = to_json(&yaml_rust2::YamlLoader::load_from_str(&text).unwrap()[0]);
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            documented.push((method.to_uppercase(), path.clone()));
        }
    }
    let mut served: Vec<(String, String)> = Endpoint::ALL
        .iter()
        .map(|e| (e.method().to_string(), e.path().to_string()))
        .collect();
    documented.sort();
    served.sort();
    assert_eq!(documented, served, "docs/api.yaml and the server disagree");

    let dir = Scratch::new("api-yaml");
    let vm = Vm::spawn(
        // A pager and the governor, so that their parts of the figures
        // and the outcome are there to check against their schemas.
        &[
            "run",
            "--memory-budget",
            "64M",
            "--halt-poll",
            "auto",
            "--cmdline",
            "workload=spin tasks=2 seconds=600",
        ],
        &dir.path("vm.sock"),
    );
    let api = vm.api();
    // Every operation, in an order that makes each valid; shutdown last.
    let order = [
        Endpoint::Info,
        Endpoint::Stats,
        Endpoint::Metrics,
        Endpoint::HaltPoll,
        Endpoint::Boost,
        Endpoint::Migrate,
        Endpoint::Postcopy,
        Endpoint::DirtyLog,
        Endpoint::Balloon,
        Endpoint::Pause,
        Endpoint::Resume,
        Endpoint::Snapshot,
        Endpoint::Shutdown,
    ];
    assert_eq!(order.len(), served.len(), "the walk covers every endpoint");
    for (method, path) in order.map(|e| (e.method(), e.path())) {
        let op = &doc["paths"][path][method.to_lowercase()];
        let mut body = op["requestBody"]["content"]["application/json"]["example"].clone();
        if path == "/vm/snapshot" {
            body["path"] = dir.path("walk.snap").to_str().unwrap().into();
        }
        // No destination listens there: a documented failure, and the VM
        // runs on (the next operations need it). Migrations that succeed
        // are tests/migration.rs.
        let want = if path == "/vm/migrate" {
            body["to"] = format!("unix:{}", dir.path("nobody.sock").display()).into();
            "502"
        } else if path == "/vm/balloon" {
            // The built-in guest has no balloon (one at work: the lab's
            // linux-balloon scenario).
            "400"
        } else if path == "/vm/migrate/postcopy" {
            // Nothing to switch: no migration is under way (the switch
            // itself is tests/postcopy.rs).
            "409"
        } else {
            "200"
        };
        let body = (!body.is_null()).then(|| body.to_string());
        let r = api.call(method, path, body.as_deref()).unwrap();
        let status = r.status.to_string();
        let response = &op["responses"][&status];
        assert!(
            !response.is_null(),
            "{method} {path}: status {status} is not documented: {}",
            r.body
        );
        let response = resolve(&doc, response);
        if let Some(schema) = response["content"]["application/json"]["schema"].as_object() {
            let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            check_schema(
                &doc,
                &serde_json::Value::Object(schema.clone()),
                &v,
                &format!("{method} {path}"),
            );
        }
        assert_eq!(status, want, "{method} {path}: {}", r.body);
    }
    let (code, outcome, stderr) = vm.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(outcome["ended"], "shutdown");
    // The `--json` outcomes are schemas of api.yaml too: a booted VM's and
    // a restored one's (with its `restore` part).
    let run_outcome = &doc["components"]["schemas"]["RunOutcome"];
    check_schema(&doc, run_outcome, &outcome, "hover run --json");
    // The snapshotted guest runs for minutes: the restored VM is ended
    // through its API too.
    let snap = dir.path("walk.snap");
    let restored = Vm::spawn(
        &["restore", snap.to_str().unwrap()],
        &dir.path("restored.sock"),
    )
    .shut_down();
    assert!(restored["restore"].is_object(), "{restored}");
    check_schema(&doc, run_outcome, &restored, "hover restore --json");
}

#[test]
fn the_api_socket_answers_as_soon_as_it_appears() {
    if !kvm_for_test("the_api_socket_answers_as_soon_as_it_appears") {
        return;
    }
    let dir = Scratch::new("api-appears");
    // A client that connects the moment the path exists must never be
    // refused (binding in place left a window between bind and listen).
    for round in 0..3 {
        let socket = dir.path(&format!("vm{round}.sock"));
        let mut child = common::hover_cmd()
            // The guest outlasts the checks; the test ends it.
            .args(["run", "--cmdline", "workload=spin tasks=1 seconds=600"])
            .args(["--api-socket", socket.to_str().unwrap(), "--console", "off"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "{socket:?} never appeared");
            std::hint::spin_loop();
        }
        let connected = UnixStream::connect(&socket);
        // Only the socket is in the directory: no staging name is left.
        let names: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".hover-api"))
            .collect();
        assert!(connected.is_ok(), "round {round}: {connected:?}");
        ApiClient::new(&socket, Duration::from_secs(120))
            .json("PUT", "/vm/shutdown", None)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(names.is_empty(), "left behind: {names:?}");
        assert!(status.success(), "round {round}: {status}");
    }
}

#[test]
fn dirty_log_tracks_without_sending_and_refuses_bad_requests() {
    if !kvm_for_test("dirty_log_tracks_without_sending_and_refuses_bad_requests") {
        return;
    }
    let dir = Scratch::new("api-dirty-log");
    let vm = Vm::spawn(
        &["run", "--cmdline", "workload=kvstore wss=8M seconds=600"],
        &dir.path("vm.sock"),
    );
    let api = vm.api();
    for tracker in ["bitmap", "manual", "hybrid"] {
        let body = serde_json::json!({"dirty_tracking": tracker, "seconds": 0.5, "period_ms": 100});
        let r = api
            .json("PUT", "/vm/dirty-log", Some(&body.to_string()))
            .unwrap_or_else(|e| panic!("{tracker}: {e}"));
        assert_eq!(r["tracker"], tracker, "{r}");
        assert_eq!(r["harvests"], 5, "one harvest per period: {r}");
        // kvstore writes as fast as it can: every harvest finds pages.
        assert!(r["pages_per_harvest"].as_f64().unwrap() > 0.0, "{r}");
    }
    refused(
        &api,
        "PUT",
        "/vm/dirty-log",
        r#"{"dirty_tracking": "ring", "seconds": 1}"#,
        400,
        Some("dirty_tracking"),
    );
    refused(
        &api,
        "PUT",
        "/vm/dirty-log",
        r#"{"dirty_tracking": "bitmap", "seconds": 1000}"#,
        400,
        Some("seconds"),
    );
    refused(
        &api,
        "PUT",
        "/vm/dirty-log",
        r#"{"dirty_tracking": "sometimes", "seconds": 1}"#,
        400,
        Some("dirty_tracking"),
    );
    api.json("PUT", "/vm/shutdown", None).unwrap();
    let (code, outcome, stderr) = vm.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(outcome["ended"], "shutdown");
}

#[test]
fn commands_during_a_migration_are_answered_at_once_with_409() {
    if !kvm_for_test("commands_during_a_migration_are_answered_at_once_with_409") {
        return;
    }
    let dir = Scratch::new("api-migrating");
    let vm = Vm::spawn(
        &["run", "--cmdline", "workload=spin tasks=1 seconds=600"],
        &dir.path("vm.sock"),
    );
    // A destination that takes the connection and says nothing: the
    // migration is under way (in its opening) until the test closes it.
    let dest = dir.path("dest.sock");
    let listener = std::os::unix::net::UnixListener::bind(&dest).unwrap();
    let api = vm.api();
    let body = format!(r#"{{"to": "unix:{}"}}"#, dest.display());
    let migrating = std::thread::spawn(move || api.call("PUT", "/vm/migrate", Some(&body)));
    let (conn, _) = listener.accept().unwrap();
    for (method, path, body) in [
        ("PUT", "/vm/pause", None),
        ("PUT", "/vm/shutdown", None),
        (
            "PUT",
            "/vm/snapshot",
            Some(r#"{"path": "/tmp/never.snap"}"#),
        ),
    ] {
        let r = vm.api().call(method, path, body).unwrap();
        assert_eq!(r.status, 409, "{path}: {}", r.body);
        assert!(
            r.body.contains("migration is under way"),
            "{path}: {}",
            r.body
        );
    }
    drop(conn);
    let r = migrating.join().unwrap().unwrap();
    assert_eq!(r.status, 502, "{}", r.body);
    // The migration over, commands are taken again.
    let r = vm.api().call("PUT", "/vm/pause", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    vm.shut_down();
}
