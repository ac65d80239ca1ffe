//! How Hover refuses a Firecracker API request.

/// A request refused, as Firecracker's API says it: the text of a 400's
/// `fault_message`. That text is the whole of Firecracker's error model
/// (its SDKs show it, some match on it), so the words are Firecracker's
/// own where it has them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl From<String> for Refusal {
    fn from(s: String) -> Refusal {
        Refusal(s)
    }
}

impl From<&str> for Refusal {
    fn from(s: &str) -> Refusal {
        Refusal(s.to_string())
    }
}
