//! Hover's API endpoints, stated once: the server dispatches on
//! [`Endpoint`], answers 404 and 405 from [`Endpoint::find`], the
//! docs/api.yaml test walks [`Endpoint::ALL`], and `hover ctl` sends
//! [`Endpoint::method`] and [`Endpoint::path`].

use super::requests::ApiFailure;

/// One endpoint of Hover's control API (docs/api.yaml documents each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /vm`: state, configuration, uptime.
    Info,
    /// `PUT /vm/pause`: stop the vCPUs (the VM keeps its state).
    Pause,
    /// `PUT /vm/resume`: run the vCPUs again.
    Resume,
    /// `PUT /vm/shutdown`: end the VM.
    Shutdown,
    /// `PUT /vm/snapshot` `{"path": ..., "stop": bool}`: snapshot to a new file.
    Snapshot,
    /// `GET /vm/stats`: live figures (what `hover stats` shows).
    Stats,
    /// `PUT /vm/halt-poll` `{"mode": ..., ...}`: change halt polling live.
    HaltPoll,
    /// `PUT /vm/boost` `{"mode": ..., "policy": ..., ...}`: change vCPU boosting live.
    Boost,
    /// `PUT /vm/migrate` `{"to": ..., ...}`: live migration to `hover receive`.
    Migrate,
    /// `PUT /vm/migrate/postcopy`: a hybrid migration switches to post-copy now.
    Postcopy,
    /// `PUT /vm/dirty-log` `{"dirty_tracking": ..., "seconds": ...}`: track
    /// dirty pages for a while, nothing sent.
    DirtyLog,
    /// `PUT /vm/balloon` `{"target_mib": ..., "stats_polling_interval_s": ...}`:
    /// the balloon's target and statistics interval; answers its report.
    Balloon,
    /// `GET /metrics`: Prometheus text exposition.
    Metrics,
}

impl Endpoint {
    /// Every endpoint, in the order docs/api.yaml lists them.
    pub const ALL: [Endpoint; 13] = [
        Endpoint::Info,
        Endpoint::Pause,
        Endpoint::Resume,
        Endpoint::Shutdown,
        Endpoint::Snapshot,
        Endpoint::Stats,
        Endpoint::HaltPoll,
        Endpoint::Boost,
        Endpoint::Migrate,
        Endpoint::Postcopy,
        Endpoint::DirtyLog,
        Endpoint::Balloon,
        Endpoint::Metrics,
    ];

    /// The HTTP method it takes.
    pub const fn method(self) -> &'static str {
        match self {
            Endpoint::Info | Endpoint::Stats | Endpoint::Metrics => "GET",
            _ => "PUT",
        }
    }

    /// Its path.
    pub const fn path(self) -> &'static str {
        match self {
            Endpoint::Info => "/vm",
            Endpoint::Pause => "/vm/pause",
            Endpoint::Resume => "/vm/resume",
            Endpoint::Shutdown => "/vm/shutdown",
            Endpoint::Snapshot => "/vm/snapshot",
            Endpoint::Stats => "/vm/stats",
            Endpoint::HaltPoll => "/vm/halt-poll",
            Endpoint::Boost => "/vm/boost",
            Endpoint::Migrate => "/vm/migrate",
            Endpoint::Postcopy => "/vm/migrate/postcopy",
            Endpoint::DirtyLog => "/vm/dirty-log",
            Endpoint::Balloon => "/vm/balloon",
            Endpoint::Metrics => "/metrics",
        }
    }

    /// The endpoint `method` `path` (no query) names; else 405 naming the
    /// method a known path takes, or 404.
    pub(super) fn find(method: &str, path: &str) -> Result<Endpoint, ApiFailure> {
        let quote = super::quote;
        match Endpoint::ALL.iter().find(|e| e.path() == path) {
            Some(e) if e.method() == method => Ok(*e),
            Some(e) => Err(ApiFailure::new(
                405,
                format!("{path} takes {}, not {}", e.method(), quote(method)),
            )),
            None => Err(ApiFailure::new(
                404,
                format!(
                    "no such endpoint: {} {} (see docs/api.yaml)",
                    quote(method),
                    quote(path)
                ),
            )),
        }
    }

    /// Whether `path` (without a query) is one of Hover's endpoints.
    pub fn is_hover_path(path: &str) -> bool {
        Endpoint::ALL.iter().any(|e| e.path() == path)
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn paths_are_distinct_and_each_is_found_by_its_method() {
        for e in Endpoint::ALL {
            assert_eq!(Endpoint::find(e.method(), e.path()).ok(), Some(e));
            let n = Endpoint::ALL
                .iter()
                .filter(|o| o.path() == e.path())
                .count();
            assert_eq!(n, 1, "{} stated once", e.path());
        }
    }

    #[test]
    fn a_known_path_with_another_method_is_405_and_an_unknown_one_404() {
        let wrong = Endpoint::find("DELETE", "/vm/pause").unwrap_err();
        assert_eq!(wrong.status, 405);
        assert!(wrong.message.contains("takes PUT"), "{}", wrong.message);
        assert_eq!(
            Endpoint::find("GET", "/vm/nothing").unwrap_err().status,
            404
        );
    }
}
