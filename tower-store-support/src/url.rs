//! Store URLs as messages show them.

/// `url` without its password (its whole userinfo), for messages, logs and
/// `Debug`: `redis://:hunter2@cache:6379/0` is shown as
/// `redis://[redacted]@cache:6379/0`; a URL without userinfo is unchanged.
/// A comma-separated list (a Redis Cluster's nodes) is redacted URL by URL.
pub fn redact_url(url: &str) -> String {
    url.split(',').map(redact_one).collect::<Vec<_>>().join(",")
}

fn redact_one(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://[redacted]@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_their_password() {
        assert_eq!(
            redact_url("redis://:hunter2@cache:6379/0"),
            "redis://[redacted]@cache:6379/0"
        );
        assert_eq!(
            redact_url("rediss://user:p@ss@cache:6380"),
            "rediss://[redacted]@cache:6380"
        );
        assert_eq!(redact_url("redis://cache:6379"), "redis://cache:6379");
        assert_eq!(redact_url("dead-letters.redb"), "dead-letters.redb");
        assert_eq!(
            redact_url("redis://:pw@a:7000,redis://b:7001,redis://u:pw@c:7002"),
            "redis://[redacted]@a:7000,redis://b:7001,redis://[redacted]@c:7002"
        );
    }
}
