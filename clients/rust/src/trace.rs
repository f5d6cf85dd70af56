//! W3C trace context (`traceparent`) helpers: a job carries its producer's
//! trace in `meta.traceparent`, and its handler sees it as
//! [`JobContext::traceparent`](crate::JobContext::traceparent).

/// Whether `text` is a well-formed `traceparent`
/// (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, ids not all zero).
pub fn is_traceparent(text: &str) -> bool {
    let parts: Vec<&str> = text.split('-').collect();
    let hex = |part: &str, len: usize| {
        part.len() == len && part.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    };
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|byte| byte != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|byte| byte != b'0')
        && hex(parts[3], 2)
}

/// A child of `parent` (same trace, a new span id, the parent's flags), or
/// a new sampled root trace when `parent` is `None` or malformed.
pub fn child_traceparent(parent: Option<&str>) -> String {
    let span = loop {
        let span: u64 = rand::random();
        if span != 0 {
            break span;
        }
    };
    match parent.filter(|parent| is_traceparent(parent)) {
        Some(parent) => {
            let parts: Vec<&str> = parent.split('-').collect();
            format!("00-{}-{span:016x}-{}", parts[1], parts[3])
        }
        None => {
            let trace = loop {
                let trace: u128 = rand::random();
                if trace != 0 {
                    break trace;
                }
            };
            format!("00-{trace:032x}-{span:016x}-01")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_keep_the_trace_and_change_the_span() {
        let root = child_traceparent(None);
        assert!(is_traceparent(&root), "{root}");
        let child = child_traceparent(Some(&root));
        assert!(is_traceparent(&child));
        assert_eq!(root[3..35], child[3..35]);
        assert_ne!(root[36..52], child[36..52]);
        assert!(!is_traceparent("00-00000000000000000000000000000000-0000000000000001-01"));
        assert!(!is_traceparent("not a trace"));
    }
}
