//! Loading: the documented block in every format, and every refused value
//! named by the exact key that holds it.

use std::path::PathBuf;

use proptest::prelude::*;
use tower_poison::Action;
use tower_retry_budget::{BackoffKind, Jitter};
use tower_steadfast::{LoadError, ResilienceConfig};

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Loads `name` with the loader its extension names.
/// The block as read, as its `Serialize` writes it back: a key left out
/// is absent.
fn block(config: &ResilienceConfig) -> serde_json::Value {
    serde_json::to_value(config).unwrap()
}

fn load(name: &str) -> Result<ResilienceConfig, LoadError> {
    let text = fixture(name);
    match name.rsplit('.').next() {
        Some("yaml") => ResilienceConfig::from_yaml_str(&text),
        Some("toml") => ResilienceConfig::from_toml_str(&text),
        Some("json") => ResilienceConfig::from_json_str(&text),
        other => panic!("no loader for {other:?}"),
    }
}

fn refusal(name: &str) -> (String, String) {
    match load(name) {
        Ok(config) => panic!("{name} loaded: {config:?}"),
        Err(LoadError::Invalid(error)) => (error.field().to_owned(), error.reason().to_owned()),
        Err(other) => panic!("{name}: not a refused value: {other}"),
    }
}

#[test]
fn the_documented_block_loads_unchanged_in_every_format() {
    let yaml = load("seed.yaml").unwrap();
    // The block as read, written back by the layers' own names.
    // Written out, not derived from the library, so a renamed or reordered
    // class fails here.
    let retry_on = [
        "http_5xx",
        "rate_limited",
        "connection",
        "timeout",
        "not_sent",
    ];
    assert_eq!(
        block(&yaml),
        serde_json::json!({
            "retry": {
                "max_attempts": 5,
                "backoff": BackoffKind::Exponential.as_str(),
                "base_ms": 200,
                "max_ms": 30_000,
                // `jitter: true` is the seed's ±50 % around each wait.
                "jitter": Jitter::Proportional { low: 0.5, high: 1.5 }.to_string(),
                "retry_on": retry_on,
            },
            "circuit_breaker": {"consecutive_failures": 5, "cooldown_secs": 60},
            "poison": {"max_row_attempts": 3, "action": Action::Dlq.to_string()},
        })
    );

    assert_eq!(load("seed.toml").unwrap(), yaml);
    assert_eq!(load("seed.json").unwrap(), yaml);
}

#[test]
fn keys_left_out_keep_the_layers_defaults() {
    // The seed's block writes its values; a key it leaves out is absent,
    // and the stack builds it at the layer's own default.
    let seed = load("seed.yaml").unwrap();
    let default = ResilienceConfig::default();
    // No key is set: every section is empty.
    assert_eq!(
        block(&default),
        serde_json::json!({"retry": {}, "circuit_breaker": {}, "poison": {}})
    );
    // `max_row_attempts` has no layer default: 3, as the seed writes it.
    assert_eq!(block(&seed)["poison"]["max_row_attempts"], 3);
    assert_eq!(block(&seed)["circuit_breaker"]["cooldown_secs"], 60);
    // Every retry key the seed writes is read as written.
    assert_ne!(block(&seed)["retry"], block(&default)["retry"]);
    assert_eq!(
        ResilienceConfig::from_yaml_str("resilience: {}").unwrap(),
        ResilienceConfig::default()
    );
    assert_eq!(
        ResilienceConfig::from_yaml_str("").unwrap(),
        ResilienceConfig::default()
    );
    // A section with every key commented out is empty, not an error.
    assert_eq!(
        ResilienceConfig::from_yaml_str("retry:\n  # max_attempts: 3\npoison:\n").unwrap(),
        ResilienceConfig::default()
    );
}

#[test]
fn the_wrapper_is_optional() {
    let bare = "retry:\n  max_attempts: 2\n  backoff: fixed\n";
    let wrapped = "resilience:\n  retry:\n    max_attempts: 2\n    backoff: fixed\n";
    let config = ResilienceConfig::from_yaml_str(bare).unwrap();
    assert_eq!(config, ResilienceConfig::from_yaml_str(wrapped).unwrap());
    assert_eq!(
        block(&config)["retry"],
        serde_json::json!({"max_attempts": 2, "backoff": BackoffKind::Fixed.as_str()})
    );
}

#[test]
fn max_attempts_zero_is_refused_naming_the_key() {
    let (field, reason) = refusal("bad/max_attempts_zero.yaml");
    assert_eq!(field, "resilience.retry.max_attempts");
    assert_eq!(
        reason,
        "must be a whole number, from 1 (no retry) to 17 (got 0)"
    );
}

#[test]
fn an_unknown_backoff_is_refused_naming_the_key() {
    let (field, reason) = refusal("bad/backoff_quadratic.yaml");
    assert_eq!(field, "resilience.retry.backoff");
    assert_eq!(
        reason,
        "unknown backoff `quadratic`; expected `none`, `fixed`, `linear` or `exponential`"
    );
}

#[test]
fn a_negative_base_is_refused_in_words_in_every_format() {
    for name in [
        "bad/base_ms_negative.yaml",
        "bad/base_ms_negative.toml",
        "bad/base_ms_negative.json",
    ] {
        let (field, reason) = refusal(name);
        assert_eq!(field, "resilience.retry.base_ms", "{name}");
        assert_eq!(
            reason, "must be a whole number of milliseconds, 0 or more (got -5)",
            "{name}"
        );
    }
}

#[test]
fn an_empty_retry_on_is_refused_in_every_format() {
    for name in [
        "bad/retry_on_empty.yaml",
        "bad/retry_on_empty.toml",
        "bad/retry_on_empty.json",
    ] {
        let (field, reason) = refusal(name);
        assert_eq!(field, "resilience.retry.retry_on", "{name}");
        assert!(
            reason.starts_with("must name at least one class"),
            "{name}: {reason}"
        );
        assert!(
            reason.contains("leave the key out to retry every class"),
            "{reason}"
        );
    }
}

#[test]
fn a_cooldown_in_words_is_refused_in_every_format() {
    for name in [
        "bad/cooldown_secs_text.yaml",
        "bad/cooldown_secs_text.toml",
        "bad/cooldown_secs_text.json",
    ] {
        let (field, reason) = refusal(name);
        assert_eq!(field, "resilience.circuit_breaker.cooldown_secs", "{name}");
        assert_eq!(
            reason, "must be a whole number of seconds, 1 or more (got the text \"soon\")",
            "{name}"
        );
    }
}

#[test]
fn an_unknown_action_is_refused_naming_the_key() {
    let (field, reason) = refusal("bad/action_archive.yaml");
    assert_eq!(field, "resilience.poison.action");
    assert_eq!(
        reason,
        "unknown action \"archive\"; expected dlq, drop or fail"
    );
}

#[test]
fn an_unknown_key_is_refused_by_name_in_every_format() {
    for name in [
        "bad/unknown_key.yaml",
        "bad/unknown_key.toml",
        "bad/unknown_key.json",
    ] {
        let (field, reason) = refusal(name);
        assert_eq!(field, "resilience.retry.max_retries", "{name}");
        assert_eq!(
            reason,
            "unknown key; expected max_attempts, backoff, base_ms, max_ms, jitter, retry_on, \
             deadline_ms, attempt_timeout_ms",
            "{name}"
        );
    }
}

#[test]
fn the_display_names_the_key_and_the_rule() {
    let error = load("bad/base_ms_negative.yaml").unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid configuration `resilience.retry.base_ms`: \
         must be a whole number of milliseconds, 0 or more (got -5)"
    );
    assert_eq!(error.field(), Some("resilience.retry.base_ms"));
}

/// `(yaml, path, reason)`: each rule of the block, broken once.
const RULES: &[(&str, &str, &str)] = &[
    (
        "retry: {max_attempts: 18}",
        "retry.max_attempts",
        "must be a whole number, from 1 (no retry) to 17 (got 18)",
    ),
    (
        "retry: {max_attempts: 2.5}",
        "retry.max_attempts",
        "must be a whole number, from 1 (no retry) to 17 (got 2.5)",
    ),
    (
        "retry: {base_ms: 500, max_ms: 400}",
        "retry.base_ms",
        "must not be more than max_ms (400), the cap on every wait (got 500)",
    ),
    (
        "retry: {base_ms: 70000}",
        "retry.base_ms",
        "must not be more than max_ms (60000, its default), the cap on every wait (got 70000)",
    ),
    // Only max_ms was written: it is the key named, not the default base_ms.
    (
        "retry: {max_ms: 100}",
        "retry.max_ms",
        "must not be less than base_ms (1000, its default), the first wait (got 100)",
    ),
    (
        "retry: {max_ms: \"30s\"}",
        "retry.max_ms",
        "must be a whole number of milliseconds, 0 or more (got the text \"30s\")",
    ),
    (
        "retry: {jitter: yes}",
        "retry.jitter",
        "unknown jitter `yes`; expected `none`, `full`, `equal`, `decorrelated` or factors \
         such as `0.5..1.5`",
    ),
    (
        "retry: {jitter: 2}",
        "retry.jitter",
        "must be a name such as true, false or `full` (got 2)",
    ),
    (
        "retry: {jitter: \"1.5..0.5\"}",
        "retry.jitter",
        "factors 1.5..0.5 must satisfy 0 <= low <= high <= 10",
    ),
    (
        "retry: {backoff: 2}",
        "retry.backoff",
        "must be a name such as `exponential` (got 2)",
    ),
    (
        "retry: {backoff: quadratic}",
        "retry.backoff",
        "unknown backoff `quadratic`; expected `none`, `fixed`, `linear` or `exponential`",
    ),
    (
        "retry: {retry_on: [http_5xx, teapot]}",
        "retry.retry_on[1]",
        "unknown class `teapot`; expected one of `http_5xx`, `rate_limited`, `connection`, \
         `timeout`, `not_sent`",
    ),
    (
        "retry: {retry_on: timeout}",
        "retry.retry_on",
        "must be a list of classes such as [http_5xx, timeout] (got the text \"timeout\")",
    ),
    (
        "retry: {deadline_ms: 0}",
        "retry.deadline_ms",
        "must be a whole number of milliseconds, 1 or more (got 0)",
    ),
    (
        "retry: {attempt_timeout_ms: \"3s\"}",
        "retry.attempt_timeout_ms",
        "must be a whole number of milliseconds, 1 or more (got the text \"3s\")",
    ),
    (
        "circuit_breaker: {consecutive_failures: 0}",
        "circuit_breaker.consecutive_failures",
        "must be a whole number of failed calls, 1 or more (got 0)",
    ),
    (
        "circuit_breaker: {consecutive_failures: 5000000000}",
        "circuit_breaker.consecutive_failures",
        "must be a whole number of failed calls, 1 to 4294967295 (got 5000000000)",
    ),
    (
        "circuit_breaker: {cooldown_secs: 0}",
        "circuit_breaker.cooldown_secs",
        "must be a whole number of seconds, 1 or more (got 0)",
    ),
    (
        "poison: {max_row_attempts: 0}",
        "poison.max_row_attempts",
        "must be a whole number of failed deliveries, 1 or more (got 0)",
    ),
    (
        "poison: {message_id_header: \"x message\"}",
        "poison.message_id_header",
        "`x message` is not a valid HTTP header name",
    ),
    (
        "retry: 5",
        "retry",
        "must be a section with the keys max_attempts, backoff, base_ms, max_ms, jitter, \
         retry_on, deadline_ms, attempt_timeout_ms (got 5)",
    ),
    (
        "retries: {}",
        "retries",
        "unknown key; expected retry, circuit_breaker, poison (or `resilience` holding them)",
    ),
    (
        "resilience: {}\npipeline: orders",
        "pipeline",
        "unknown key; expected resilience",
    ),
    (
        "resilience: {circuit_breaker: {cooldown: 60}}",
        "resilience.circuit_breaker.cooldown",
        "unknown key; expected consecutive_failures, cooldown_secs",
    ),
];

#[test]
fn every_rule_is_checked_at_load_and_names_its_key() {
    for (yaml, field, reason) in RULES {
        match ResilienceConfig::from_yaml_str(yaml) {
            Err(LoadError::Invalid(error)) => {
                assert_eq!(error.field(), *field, "{yaml}");
                assert_eq!(error.reason(), *reason, "{yaml}");
            }
            other => panic!("{yaml}: {other:?}"),
        }
    }
}

#[test]
fn the_limits_themselves_are_accepted() {
    let config = ResilienceConfig::from_yaml_str(
        "retry: {max_attempts: 17, base_ms: 0, max_ms: 0, backoff: none, retry_on: [timeout, timeout]}\n\
         circuit_breaker: {consecutive_failures: 1, cooldown_secs: 1}\n\
         poison: {max_row_attempts: 1, action: fail, message_id_header: x-message-id}",
    )
    .unwrap();
    let read = block(&config);
    assert_eq!(
        read["retry"]["max_attempts"],
        tower_retry_budget::MAX_RETRIES_LIMIT + 1
    );
    assert_eq!(read["retry"]["retry_on"], serde_json::json!(["timeout"]));
    assert_eq!(read["poison"]["message_id_header"], "x-message-id");
    let one = ResilienceConfig::from_yaml_str("retry: {max_attempts: 1}").unwrap();
    assert_eq!(block(&one)["retry"]["max_attempts"], 1);
}

/// The most tries is the first and the retry layer's most retries: one
/// more is refused at load, naming the key and the range.
#[test]
fn max_attempts_follows_the_retry_layers_limit() {
    let most = tower_retry_budget::MAX_RETRIES_LIMIT + 1;
    let over = format!("retry: {{max_attempts: {}}}", most + 1);
    match ResilienceConfig::from_yaml_str(&over) {
        Err(LoadError::Invalid(error)) => {
            assert_eq!(error.field(), "retry.max_attempts");
            assert!(
                error.reason().contains(&format!("to {most}")),
                "{}",
                error.reason()
            );
        }
        other => panic!("{over}: {other:?}"),
    }
}

#[test]
fn syntax_errors_say_which_format() {
    let yaml = ResilienceConfig::from_yaml_str("retry: [").unwrap_err();
    assert!(
        matches!(yaml, LoadError::Syntax { format: "YAML", .. }),
        "{yaml}"
    );
    let toml = ResilienceConfig::from_toml_str("[retry\n").unwrap_err();
    assert!(
        matches!(toml, LoadError::Syntax { format: "TOML", .. }),
        "{toml}"
    );
    let json = ResilienceConfig::from_json_str("{").unwrap_err();
    assert!(
        matches!(json, LoadError::Syntax { format: "JSON", .. }),
        "{json}"
    );
    assert_eq!(json.field(), None);
}

#[test]
fn the_block_embeds_in_an_application_config_with_serde() {
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct AppConfig {
        listen: String,
        resilience: ResilienceConfig,
    }
    let app: AppConfig =
        yaml_serde::from_str("listen: 0.0.0.0:8080\nresilience:\n  retry:\n    max_attempts: 3\n")
            .unwrap();
    assert_eq!(block(&app.resilience)["retry"]["max_attempts"], 3);

    let error = yaml_serde::from_str::<AppConfig>(
        "listen: 0.0.0.0:8080\nresilience:\n  retry:\n    base_ms: -5\n",
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("`retry.base_ms`: must be a whole number of milliseconds, 0 or more"),
        "{error}"
    );
}

/// A valid block in which every key may be left out; a key left out must
/// stay out when the block is written back.
fn any_config_yaml() -> impl Strategy<Value = String> {
    use proptest::option::of;
    let retry = (
        of(1u32..=17),
        of(prop::sample::select(vec![
            "none",
            "fixed",
            "linear",
            "exponential",
        ])),
        (0u64..=60_000, 0u64..=60_000, any::<(bool, bool)>()),
        of(prop::sample::select(vec![
            "true",
            "false",
            "full",
            "equal",
            "none",
            "decorrelated",
            "0.5..1.5",
            "0.5..1",
        ])),
        of(prop::sample::subsequence(
            vec![
                "http_5xx",
                "rate_limited",
                "connection",
                "timeout",
                "not_sent",
            ],
            1..=5,
        )),
    );
    let others = (
        of(1u32..=100),
        of(1u64..=3_600),
        of(1u32..=10),
        of(prop::sample::select(vec!["dlq", "drop", "fail"])),
    );
    (retry, others).prop_map(
        |((attempts, backoff, (a, b, (with_base, with_max)), jitter, classes), others)| {
            let (failures, cooldown, rows, action) = others;
            // The wait's base may not pass its cap; a key left out is the
            // retry layer's (a 1 s base, a 60 s cap).
            let (base, max) = match (with_base, with_max) {
                (true, true) => (Some(a.min(b)), Some(a.max(b))),
                (true, false) => (Some(a), None),
                (false, true) => (None, Some(a.max(1_000))),
                (false, false) => (None, None),
            };
            let line = |key: &str, value: Option<String>| {
                value
                    .map(|v| format!("    {key}: {v}\n"))
                    .unwrap_or_default()
            };
            format!(
                "resilience:\n  retry:\n{}{}{}{}{}{}  circuit_breaker:\n{}{}  poison:\n{}{}",
                line("max_attempts", attempts.map(|v| v.to_string())),
                line("backoff", backoff.map(str::to_owned)),
                line("base_ms", base.map(|v| v.to_string())),
                line("max_ms", max.map(|v| v.to_string())),
                line(
                    "jitter",
                    jitter.map(|v| format!("\"{v}\"")
                        .replace("\"true\"", "true")
                        .replace("\"false\"", "false"))
                ),
                line("retry_on", classes.map(|c| format!("[{}]", c.join(", ")))),
                line("consecutive_failures", failures.map(|v| v.to_string())),
                line("cooldown_secs", cooldown.map(|v| v.to_string())),
                line("max_row_attempts", rows.map(|v| v.to_string())),
                line("action", action.map(str::to_owned)),
            )
        },
    )
}

/// A block whose `circuit_breaker` section has any valid
/// `consecutive_failures` and a `cooldown_secs` of `cooldown`, or none at
/// all; with what it holds.
fn any_breaker_section_yaml() -> impl Strategy<Value = (u32, Option<u64>, String)> {
    // TOML integers are signed 64-bit: a larger cooldown could not be
    // written back to TOML at all.
    (1u32..1000, proptest::option::of(1u64..=i64::MAX as u64)).prop_map(|(failures, cooldown)| {
        let cooldown_line = cooldown
            .map(|secs| format!("    cooldown_secs: {secs}\n"))
            .unwrap_or_default();
        let yaml = format!(
            "resilience:\n  circuit_breaker:\n    consecutive_failures: {failures}\n{cooldown_line}"
        );
        (failures, cooldown, yaml)
    })
}

proptest! {
    /// Any valid block loads, and what it loads writes back (in each
    /// format) to text that loads to the same configuration.
    #[test]
    fn valid_blocks_round_trip_through_every_format(yaml in any_config_yaml()) {
        let config = ResilienceConfig::from_yaml_str(&yaml).unwrap();
        let json = serde_json::to_string(&config).unwrap();
        prop_assert_eq!(&ResilienceConfig::from_json_str(&json).unwrap(), &config);
        let toml = toml::to_string(&config).unwrap();
        prop_assert_eq!(&ResilienceConfig::from_toml_str(&toml).unwrap(), &config);
        let yaml_again = yaml_serde::to_string(&config).unwrap();
        prop_assert_eq!(&ResilienceConfig::from_yaml_str(&yaml_again).unwrap(), &config);
        // Building the stack never fails for a loaded configuration.
        let _ = config.layer("orders", tower_poison::store::MemoryStore::new(1));
    }

    /// `cooldown_secs` left out stays out: the breaker's backing-off
    /// schedule, and the config written back in
    /// every format leaves the key out rather than writing it as null, which
    /// the loader refuses. Given, it is the fixed period, written back as is.
    #[test]
    fn an_absent_cooldown_stays_absent_through_every_format(
        (failures, cooldown, yaml) in any_breaker_section_yaml()
    ) {
        let config = ResilienceConfig::from_yaml_str(&yaml).unwrap();
        let json = serde_json::to_value(&config).unwrap();
        prop_assert_eq!(&json["circuit_breaker"]["consecutive_failures"], &serde_json::Value::from(failures));
        let written = json["circuit_breaker"].get("cooldown_secs").cloned();
        prop_assert_eq!(written, cooldown.map(serde_json::Value::from));
        let toml = toml::to_string(&config).unwrap();
        prop_assert_eq!(toml.contains("cooldown_secs"), cooldown.is_some(), "{}", toml);
        let yaml_again = yaml_serde::to_string(&config).unwrap();
        prop_assert_eq!(yaml_again.contains("cooldown_secs"), cooldown.is_some(), "{}", yaml_again);

        prop_assert_eq!(&ResilienceConfig::from_json_str(&json.to_string()).unwrap(), &config);
        prop_assert_eq!(&ResilienceConfig::from_toml_str(&toml).unwrap(), &config);
        prop_assert_eq!(&ResilienceConfig::from_yaml_str(&yaml_again).unwrap(), &config);

        let null = format!(
            "resilience:\n  circuit_breaker:\n    consecutive_failures: {failures}\n    cooldown_secs: null\n"
        );
        let refused = ResilienceConfig::from_yaml_str(&null).unwrap_err();
        prop_assert_eq!(refused.field(), Some("resilience.circuit_breaker.cooldown_secs"));
    }

    /// Any whole number outside 1..=17 is refused for max_attempts, by name.
    #[test]
    fn max_attempts_outside_the_range_is_refused(n in prop_oneof![Just(0u64), 18u64..u64::MAX]) {
        let error = ResilienceConfig::from_json_str(&format!(r#"{{"retry": {{"max_attempts": {n}}}}}"#))
            .unwrap_err();
        prop_assert_eq!(error.field(), Some("retry.max_attempts"));
    }
}

/// Loading checks the breaker's settings by building one, with no recorder:
/// a reload must not register series that reset a live breaker's gauges
/// (every layer built from a config is named `default` unless renamed).
#[test]
fn loading_registers_no_metric() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        load("seed.yaml").unwrap();
    });
    let registered: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, ..)| key.key().name().to_owned())
        .collect();
    assert!(registered.is_empty(), "{registered:?}");
}
