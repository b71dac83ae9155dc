//! The admin page as an operator uses it: the `admin_page` example serving
//! its live scenario, the page opened in headless Chromium (driven over the
//! W3C WebDriver protocol by chromedriver), a breaker forced open with a
//! click and a dead letter replayed with two, each change checked on the
//! page. Screenshots go to `target/admin-page-screenshots/`.
//!
//! Skips, saying why, when `chromium` or `chromedriver` is missing; fails
//! instead when `TOWER_ADMIN_REQUIRE_BROWSER=1` (as CI sets it).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use examples::client::{http_client, HttpService};
use http::{Method, Request};
use http_body_util::Full;
use serde_json::{json, Value};
use tower::ServiceExt;

const TOKEN: &str = "browser-test-operator-token";
/// W3C WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
const CHROMIUM_FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
];

/// A child process killed when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// `target/<profile>`, from this test binary's `target/<profile>/deps/…`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// Starts the example; returns it, the page's address, and a receiver told
/// when the orders upstream has recovered.
fn start_example() -> (Running, String, std::sync::mpsc::Receiver<()>) {
    let path = profile_dir()
        .join("examples")
        .join(format!("admin_page{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p examples --examples` first",
        path.display()
    );
    let mut child = Command::new(path)
        .args(["--exit-after", "60"])
        .env("ADMIN_PAGE_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let stdout = child.stdout.take().expect("piped");
    let running = Running(child);
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("the example prints the page's address")
            .expect("readable output");
        if let Some(url) = line.strip_prefix("admin page: ") {
            break url.to_owned();
        }
    };
    // The rest is read on, so the pipe stays open; the line saying the
    // outage is over is passed on.
    let (recovered, told) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if line == "orders upstream recovered" {
                let _ = recovered.send(());
            }
        }
    });
    (running, url, told)
}

struct WebDriver {
    client: HttpService,
    base: String,
}

impl WebDriver {
    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        let request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .unwrap();
        let response = self
            .client
            .clone()
            .oneshot(request)
            .await
            .map_err(|e| format!("chromedriver: {e}"))?;
        let value: Value =
            serde_json::from_slice(response.body()).map_err(|e| format!("chromedriver: {e}"))?;
        if response.status().is_success() {
            Ok(value["value"].clone())
        } else {
            Err(format!("{path}: {}", value["value"]))
        }
    }
}

struct Session {
    driver: WebDriver,
    id: String,
    shots: PathBuf,
}

impl Session {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        let path = format!("/session/{}{path}", self.id);
        self.driver.send(method, &path, body).await
    }

    async fn script(&self, script: &str, args: Value) -> Value {
        self.call(
            Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
        .expect("the script runs")
    }

    /// The text of the first element `selector` matches, if any.
    async fn text(&self, selector: &str) -> Option<String> {
        let value = self
            .script(
                "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
                json!([selector]),
            )
            .await;
        value.as_str().map(str::to_owned)
    }

    /// Waits (up to 15 s) until `check` holds for the page.
    async fn wait_for<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !check().await {
            if Instant::now() > deadline {
                self.screenshot("failed").await;
                panic!("the page never showed {what}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the element `selector` matches, as a pointer would. The page
    /// redraws its tables on every poll, so an element found just before a
    /// redraw may be gone: it is found again.
    async fn click(&self, selector: &str) {
        let mut last = String::new();
        for _ in 0..20 {
            let found = self
                .call(
                    Method::POST,
                    "/element",
                    Some(json!({"using": "css selector", "value": selector})),
                )
                .await;
            match found {
                Ok(element) => {
                    let id = element[ELEMENT].as_str().expect("an element reference");
                    match self
                        .call(
                            Method::POST,
                            &format!("/element/{id}/click"),
                            Some(json!({})),
                        )
                        .await
                    {
                        Ok(_) => return,
                        Err(e) => last = e,
                    }
                }
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("could not click {selector}: {last}");
    }

    async fn type_into(&self, selector: &str, text: &str) {
        let element = self
            .call(
                Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": selector})),
            )
            .await
            .expect("the element");
        let id = element[ELEMENT].as_str().expect("an element reference");
        self.call(
            Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({"text": text})),
        )
        .await
        .expect("typed");
    }

    async fn screenshot(&self, name: &str) {
        if let Ok(png) = self.call(Method::GET, "/screenshot", None).await {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(png.as_str().unwrap_or_default())
                .expect("base64 PNG");
            std::fs::write(self.shots.join(format!("{name}.png")), bytes).expect("written");
        }
    }
}

/// Chromium and chromedriver, or why the test cannot run.
fn browser() -> Result<(PathBuf, PathBuf), String> {
    let chromium = find(&["chromium", "chromium-browser", "google-chrome"])
        .ok_or("no chromium on PATH (Debian: apt-get install chromium chromium-driver)")?;
    let driver = find(&["chromedriver"])
        .ok_or("no chromedriver on PATH (Debian: apt-get install chromium-driver)")?;
    Ok((chromium, driver))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_forces_a_breaker_open_and_replays_a_dead_letter_from_the_page() {
    let (chromium, chromedriver) = match browser() {
        Ok(found) => found,
        Err(why) if std::env::var_os("TOWER_ADMIN_REQUIRE_BROWSER").is_some_and(|v| v == "1") => {
            panic!("TOWER_ADMIN_REQUIRE_BROWSER=1 but {why}")
        }
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let started = Instant::now();
    let (_example, url, recovered) = start_example();

    let port = free_port();
    let _driver = Running(
        Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts"),
    );
    let driver = WebDriver {
        client: http_client(),
        base: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while driver
        .send(Method::GET, "/status", None)
        .await
        .map(|s| s["ready"] == true)
        != Ok(true)
    {
        assert!(Instant::now() < deadline, "chromedriver did not get ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let profile = tempfile::tempdir().expect("a profile directory");
    let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|f| f.to_string()).collect();
    args.push(format!("--user-data-dir={}", profile.path().display()));
    let created = driver
        .send(
            Method::POST,
            "/session",
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": chromium, "args": args},
            }}})),
        )
        .await
        .expect("a browser session");
    let shots = profile_dir()
        .parent()
        .expect("target/")
        .join("admin-page-screenshots");
    std::fs::create_dir_all(&shots).expect("the screenshot directory");
    let page = Session {
        id: created["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned(),
        driver,
        shots,
    };

    page.call(Method::POST, "/url", Some(json!({"url": url})))
        .await
        .expect("the page opens");
    page.wait_for("the token form", || async {
        page.text("#login h2").await.is_some()
    })
    .await;
    page.type_into("#token", TOKEN).await;
    page.click("#sign-in").await;

    // Live: the breakers and, once the outage has failed some orders, the
    // dead letters appear without a reload.
    page.wait_for("the orders breaker", || async {
        page.text(r#"tr[data-key="orders"] td.state"#)
            .await
            .is_some()
    })
    .await;
    page.wait_for("dead letters labelled orders", || async {
        page.text(r#"[data-label="orders"]"#).await.is_some()
            && page.text("#stores tr.entry").await.is_some()
    })
    .await;
    page.wait_for("payments retries counted", || async {
        page.text(r#"tr[data-stack="payments"] td.retries"#)
            .await
            .is_some_and(|text| !text.ends_with("(0)"))
    })
    .await;
    // Replays sent after the outage are delivered.
    recovered
        .recv_timeout(Duration::from_secs(15))
        .expect("the example says when the orders upstream recovered");
    page.screenshot("1-live").await;

    // Force the orders breaker open with a click.
    page.click(r#"tr[data-key="orders"] button.force-open"#)
        .await;
    page.wait_for("the orders breaker forced open", || async {
        page.text(r#"tr[data-key="orders"] td.state"#)
            .await
            .as_deref()
            == Some("forced_open")
    })
    .await;
    assert_eq!(
        page.text("#notice").await.as_deref(),
        Some("Forced open: orders")
    );
    page.screenshot("2-forced-open").await;

    // Replay the newest orders entry: a click, then the confirmation.
    page.click(r#"[data-label="orders"] button.filter"#).await;
    let id = loop {
        let id = page
            .script(
                "const rows = [...document.querySelectorAll('#stores tr.entry')]; \
                 return rows.length && rows.every(r => r.children[1].textContent === 'orders') \
                     ? rows[0].dataset.id : null;",
                json!([]),
            )
            .await;
        if let Some(id) = id.as_str() {
            break id.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    page.click(&format!(r#"tr[data-id="{id}"] button.replay"#))
        .await;
    page.wait_for("the confirmation", || async {
        page.text("#confirm-text")
            .await
            .is_some_and(|text| text.contains(&id))
    })
    .await;
    page.screenshot("3-confirm-replay").await;
    page.click("#confirm-yes").await;
    page.wait_for("the replay's outcome", || async {
        page.text("#notice").await.as_deref() == Some(&format!("Replayed {id}: delivered"))
    })
    .await;
    page.wait_for("the replayed entry gone from the list", || async {
        page.text(&format!(r#"tr[data-id="{id}"]"#)).await.is_none()
    })
    .await;
    page.screenshot("4-replayed").await;

    // One entry shown in full: its body's markup is shown as text, and no
    // element was made of it.
    page.click("#stores tr.entry button.show").await;
    page.wait_for("an entry shown", || async {
        page.text("#entry-body")
            .await
            .is_some_and(|text| text.contains("\"label\": \"orders\""))
    })
    .await;
    let body = page.text("#entry-body").await.unwrap_or_default();
    assert!(body.contains("<img src=x onerror=alert(1)>"), "{body}");
    let images = page
        .script("return document.querySelectorAll('img').length;", json!([]))
        .await;
    assert_eq!(images, json!(0), "markup from an entry became an element");
    page.screenshot("5-entry").await;

    let _ = page.call(Method::DELETE, "", None).await;
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "took {:?}",
        started.elapsed()
    );
}
