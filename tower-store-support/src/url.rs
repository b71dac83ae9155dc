//! Store URLs as messages show them.

/// `url` without its password (its whole userinfo), for messages, logs and
/// `Debug`: `redis://:hunter2@cache:6379/0` is shown as
/// `redis://[redacted]@cache:6379/0`; a URL without userinfo is unchanged.
/// A comma-separated list (a Redis Cluster's nodes) is redacted URL by URL.
pub fn redact_url(url: &str) -> String {
    split_list(url)
        .into_iter()
        .map(redact_one)
        .collect::<Vec<_>>()
        .join(",")
}

/// The URLs of a comma-separated list, untrimmed (an empty last one for a
/// trailing comma); one piece for a single URL. A comma splits only where a
/// next URL starts (`redis://`, `rediss://`) or the list ends: a password
/// may hold a comma, and must neither split its URL nor escape redaction.
pub(crate) fn split_list(list: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (comma, _) in list.match_indices(',') {
        let rest = list[comma + 1..].trim_start();
        if rest.is_empty() || rest.starts_with("redis://") || rest.starts_with("rediss://") {
            pieces.push(&list[start..comma]);
            start = comma + 1;
        }
    }
    pieces.push(&list[start..]);
    pieces
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
        // A comma in a password neither splits the URL nor escapes.
        assert_eq!(
            redact_url("redis://:pa,ss@cache:6379"),
            "redis://[redacted]@cache:6379"
        );
        assert_eq!(
            redact_url("redis://:pa,ss@a:7000,redis://:x,y@b:7001,"),
            "redis://[redacted]@a:7000,redis://[redacted]@b:7001,"
        );
    }

    #[test]
    fn a_list_splits_only_where_a_next_url_starts_or_it_ends() {
        assert_eq!(
            split_list("redis://:pa,ss@cache:6379"),
            ["redis://:pa,ss@cache:6379"]
        );
        assert_eq!(split_list("redis://a:7000,"), ["redis://a:7000", ""]);
        assert_eq!(
            split_list("redis://a:7000, rediss://b:7001"),
            ["redis://a:7000", " rediss://b:7001"]
        );
    }
}
