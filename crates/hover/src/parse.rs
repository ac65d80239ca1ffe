//! How the command line spells sizes and durations: clap's value parsers
//! for every such flag (a setting's own type checks its range).

use std::time::Duration;

/// A size such as `256M`, `1G`, `4096` or `512MiB` (binary units), read
/// as the guest reads its workloads' sizes ([`hover_abi::workload::parse_size`]).
pub fn parse_size(s: &str) -> Result<u64, String> {
    hover_abi::workload::parse_size(s.trim()).ok_or_else(|| {
        format!("'{s}' is not a size: use a number with an optional K, M, G or T suffix (e.g. 256M, 1G)")
    })
}

/// A `--disk` value: `PATH[,readonly][,id=ID]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskArg {
    /// The image file or block device.
    pub path: std::path::PathBuf,
    /// Read-only for the guest.
    pub readonly: bool,
    /// The id given, if any.
    pub id: Option<String>,
}

/// Parse `PATH[,readonly][,id=ID]`.
pub fn parse_disk(s: &str) -> Result<DiskArg, String> {
    let mut parts = s.split(',');
    let path = parts.next().unwrap_or_default();
    if path.is_empty() {
        return Err("give the disk's path first: PATH[,readonly][,id=ID]".into());
    }
    let mut disk = DiskArg {
        path: path.into(),
        readonly: false,
        id: None,
    };
    for p in parts {
        match p.split_once('=') {
            None if p == "readonly" => disk.readonly = true,
            Some(("id", id)) => disk.id = Some(id.to_string()),
            _ => {
                return Err(format!(
                "'{p}': a disk takes readonly and id=ID after its path (PATH[,readonly][,id=ID])"
            ))
            }
        }
    }
    Ok(disk)
}

/// A `--net` value: `tap=NAME[,mac=MAC]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetArg {
    /// The tap device.
    pub tap: String,
    /// The card's MAC, if given.
    pub mac: Option<[u8; 6]>,
    /// The card's id, if given.
    pub id: Option<String>,
}

/// Parse `tap=NAME[,mac=MAC][,id=ID]`.
pub fn parse_net(s: &str) -> Result<NetArg, String> {
    let (mut tap, mut mac, mut id) = (None, None, None);
    for p in s.split(',') {
        match p.split_once('=') {
            Some(("tap", name)) if !name.is_empty() => tap = Some(name.to_string()),
            Some(("mac", m)) => mac = Some(hover_vmm::devices::virtio::net::parse_mac(m)?),
            Some(("id", i)) if !i.is_empty() => id = Some(i.to_string()),
            _ => {
                return Err(format!(
                    "'{p}': a card takes tap=NAME, mac=MAC and id=ID (tap=NAME[,mac=MAC][,id=ID])"
                ))
            }
        }
    }
    let tap = tap.ok_or("give the tap: tap=NAME[,mac=MAC][,id=ID]")?;
    Ok(NetArg { tap, mac, id })
}

/// Parse a `--balloon` value: `[target=SIZE][,reporting=on|off]
/// [,stats=SECONDS][,deflate-on-oom=on|off]` (empty: the defaults).
pub fn parse_balloon(s: &str) -> Result<hover_vmm::config::BalloonConfig, String> {
    let mut b = hover_vmm::config::BalloonConfig::default();
    let on_off = |k: &str, v: &str| match v {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("'{k}={v}': give on or off")),
    };
    for p in s.split(',').filter(|p| !p.is_empty()) {
        match p.split_once('=') {
            Some(("target", v)) => {
                let bytes = parse_size(v)?;
                if bytes % (1 << 20) != 0 {
                    return Err(format!("'target={v}': give whole MiB (e.g. 64M)"));
                }
                b.target_mib = bytes >> 20;
            }
            Some(("reporting", v)) => b.free_page_reporting = on_off("reporting", v)?,
            Some(("deflate-on-oom", v)) => b.deflate_on_oom = on_off("deflate-on-oom", v)?,
            Some(("stats", v)) => {
                b.stats_interval_s = v.trim_end_matches('s').parse().map_err(|_| {
                    format!("'stats={v}': give whole seconds between statistics requests (0: none)")
                })?
            }
            _ => {
                return Err(format!(
                    "'{p}': the balloon takes target=SIZE, reporting=on|off, stats=SECONDS and deflate-on-oom=on|off"
                ))
            }
        }
    }
    Ok(b)
}

/// A duration such as `0`, `500ns`, `100us`, `2ms`, `1.5ms`, `1s` or
/// `10m` (at most an hour).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!("'{s}' is not a duration: use a number with ns, us, ms, s or m (e.g. 0, 100us, 2ms, 10m), at most an hour")
    };
    let t = s.trim();
    let (num, scale) = [
        ("ns", 1e-9),
        ("us", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
        ("m", 60.0),
    ]
    .iter()
    .find_map(|(suffix, scale)| t.strip_suffix(suffix).map(|n| (n, *scale)))
    .unwrap_or((t, if t == "0" { 1.0 } else { f64::NAN }));
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !(v * scale).is_finite() || v < 0.0 || v * scale > 3600.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// A duration as [`parse_duration`] takes it, kept as given: for a value
/// handed on to a child `hover run` (`hover bench apf --latencies`),
/// checked before anything starts.
pub fn duration_text(s: &str) -> Result<String, String> {
    parse_duration(s).map(|_| s.trim().to_string())
}

/// A timeout: a duration as [`parse_duration`] takes it (`2m`, `90s`), or
/// a bare whole number of seconds (`120`); never zero.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let d = match t.parse::<u64>() {
        Ok(secs) if secs <= 3600 => Duration::from_secs(secs),
        Ok(_) => return Err(format!("'{s}' is too long a timeout: at most an hour (3600, 60m)")),
        Err(_) => parse_duration(t).map_err(|_| {
            format!("'{s}' is not a timeout: give seconds (120) or a duration with ms, s or m (90s, 2m), at most an hour")
        })?,
    };
    if d.is_zero() {
        return Err(format!("'{s}': a timeout of zero would give up at once"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_take_seconds_or_durations() {
        assert_eq!(parse_timeout("120"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(
            parse_timeout("2m"),
            Ok(hover_vmm::migration::DEFAULT_TIMEOUT),
            "ctl migrate --timeout's default is the monitor's"
        );
        assert_eq!(parse_timeout("1500ms"), Ok(Duration::from_millis(1500)));
        for bad in ["0", "0s", "x", "-1", "3601", "2h"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn balloon_values_parse_and_bad_ones_say_what_is_taken() {
        let d = parse_balloon("").unwrap();
        assert_eq!(d, hover_vmm::config::BalloonConfig::default());
        assert!(d.free_page_reporting, "reporting on by default");
        let b = parse_balloon("target=64M,reporting=off,stats=5,deflate-on-oom=on").unwrap();
        assert_eq!(
            (
                b.target_mib,
                b.free_page_reporting,
                b.stats_interval_s,
                b.deflate_on_oom
            ),
            (64, false, 5, true)
        );
        assert_eq!(parse_balloon("stats=2s").unwrap().stats_interval_s, 2);
        for bad in ["target=100K", "reporting=yes", "stats=-1", "size=1M", "x"] {
            let e = parse_balloon(bad).unwrap_err();
            assert!(e.contains(bad.split('=').next().unwrap()), "{bad}: {e}");
        }
    }
    use hover_vmm::config::size_text;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size(" 64k "), Ok(64 << 10));
        assert!(parse_size("lots")
            .unwrap_err()
            .contains("'lots' is not a size"));
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn sizes_print_as_they_parse() {
        for n in [0, 1536, 4096, 256 << 10, 16 << 20, 1 << 30, 3 << 40] {
            assert_eq!(parse_size(&size_text(n)).unwrap(), n, "{n}");
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("2ms"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("1.5ms"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert!(parse_duration("61m").is_err(), "over an hour");
        for bad in ["2", "fast", "-1ms", "2 hours", "99999s"] {
            assert!(
                parse_duration(bad)
                    .unwrap_err()
                    .contains("is not a duration"),
                "{bad}"
            );
        }
    }
}
