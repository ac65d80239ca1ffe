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

/// A time for a flag whose name says its unit (`--boost-max-ms`,
/// `--window-ns`): a bare whole number is in that unit (`unit_ns`
/// nanoseconds, named `unit`); a duration with its own unit (`500us`,
/// `2ms`, `1s`, `2m`, as [`parse_duration`] takes them) is converted,
/// and must come to a whole number of the flag's unit.
fn in_unit(s: &str, unit_ns: u64, unit: &str) -> Result<u64, String> {
    let t = s.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    let d = parse_duration(t).map_err(|_| {
        format!("'{s}' is not a time: give a whole number of {unit} (the flag's unit) or a duration with ns, us, ms, s or m (e.g. 500us, 2ms, 1s)")
    })?;
    let ns = d.as_nanos();
    if ns % u128::from(unit_ns) != 0 {
        return Err(format!("'{s}' is not a whole number of {unit}"));
    }
    u64::try_from(ns / u128::from(unit_ns)).map_err(|_| format!("'{s}' is too long"))
}

/// A `...-ns` flag's value: see [`in_unit`].
pub fn nanos(s: &str) -> Result<u64, String> {
    in_unit(s, 1, "nanoseconds")
}

/// A `...-us` flag's value: see [`in_unit`].
pub fn micros(s: &str) -> Result<u64, String> {
    in_unit(s, 1_000, "microseconds")
}

/// A `...-ms` flag's value: see [`in_unit`].
pub fn millis(s: &str) -> Result<u64, String> {
    in_unit(s, 1_000_000, "milliseconds")
}

/// `v`, in `unit`, if at most `max`.
fn at_most(v: u64, max: u64, unit: &str) -> Result<u64, String> {
    match v <= max {
        true => Ok(v),
        false => Err(format!("{v} {unit} is out of range: give 0 to {max}")),
    }
}

/// A `...-ms` flag's value of at most `MAX` ms.
pub fn millis_max<const MAX: u64>(s: &str) -> Result<u64, String> {
    at_most(millis(s)?, MAX, "ms")
}

/// A `...-us` flag's value of at most `MAX` us.
pub fn micros_max<const MAX: u64>(s: &str) -> Result<u64, String> {
    at_most(micros(s)?, MAX, "us")
}

/// A `...-ms` flag that takes fractions (`--link-delay-ms 0.5`): a bare
/// number is milliseconds, a duration with a unit is converted.
pub fn millis_f64(s: &str) -> Result<f64, String> {
    let t = s.trim();
    if let Ok(ms) = t.parse::<f64>() {
        if ms.is_finite() && ms >= 0.0 {
            return Ok(ms);
        }
    }
    parse_duration(t)
        .map(|d| d.as_secs_f64() * 1000.0)
        .map_err(|_| format!("'{s}' is not a time: give milliseconds (0.5) or a duration with ns, us, ms, s or m (e.g. 500us, 2ms)"))
}

/// A whole number of seconds that may be 0 (`--stats 5`, `5s`, `1m`; 0:
/// none), at most an hour.
pub fn whole_seconds(s: &str) -> Result<u32, String> {
    let secs = in_unit(s, 1_000_000_000, "seconds")?;
    if secs > 3600 {
        return Err(format!("{secs} s is out of range: give 0 to 3600"));
    }
    Ok(secs as u32)
}

/// A `--seconds` value (1 to 3600): a bare whole number of seconds, or a
/// duration with a unit that comes to whole seconds (`90s`, `2m`).
pub fn seconds(s: &str) -> Result<u32, String> {
    let secs = in_unit(s, 1_000_000_000, "seconds")?;
    if !(1..=3600).contains(&secs) {
        return Err(format!("{secs} s is out of range: give 1 to 3600"));
    }
    Ok(secs as u32)
}

/// A `--seconds` value that takes fractions (more than 0, at most an
/// hour): a bare number is seconds, a duration with a unit is converted.
pub fn seconds_f64(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let secs = match t.parse::<f64>() {
        Ok(v) => v,
        Err(_) => parse_duration(t)
            .map_err(|_| format!("'{s}' is not a time: give seconds (2, 0.5) or a duration with ms, s or m (e.g. 500ms, 2s)"))?
            .as_secs_f64(),
    };
    if !(secs > 0.0 && secs <= 3600.0) {
        return Err(format!(
            "'{s}' is out of range: give more than 0 s, at most an hour"
        ));
    }
    Ok(secs)
}

/// A page-store latency for `hover bench apf --latencies`: a duration of
/// at most a second (a page-in slower than that is no device the seed's
/// experiment models, and a run of it would take minutes), kept as given.
pub fn store_latency(s: &str) -> Result<String, String> {
    let d = parse_duration(s)?;
    if d > std::time::Duration::from_secs(1) {
        return Err(format!(
            "'{s}' is too long a page-store latency: at most 1s"
        ));
    }
    Ok(s.trim().to_string())
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
    fn a_flag_with_a_unit_takes_a_bare_number_or_a_duration() {
        assert_eq!(millis("250"), Ok(250));
        assert_eq!(millis("2s"), Ok(2000));
        assert_eq!(millis("1.5s"), Ok(1500));
        assert_eq!(micros("2ms"), Ok(2000));
        assert_eq!(micros("100us"), Ok(100));
        assert_eq!(nanos("10ms"), Ok(10_000_000));
        assert_eq!(millis("0"), Ok(0));
        assert!(millis("1500us")
            .unwrap_err()
            .contains("not a whole number of milliseconds"));
        assert!(millis("fast")
            .unwrap_err()
            .contains("whole number of milliseconds (the flag's unit)"));
        assert!(millis("-1").is_err());
        assert_eq!(millis_max::<10_000>("10s"), Ok(10_000));
        assert!(millis_max::<10_000>("11s")
            .unwrap_err()
            .contains("give 0 to 10000"));
        assert_eq!(millis_f64("0.5"), Ok(0.5));
        assert_eq!(millis_f64("1s"), Ok(1000.0));
        assert!(millis_f64("soon").is_err());
        assert_eq!(seconds("90"), Ok(90));
        assert_eq!(whole_seconds("0"), Ok(0));
        assert_eq!(whole_seconds("5s"), Ok(5));
        assert_eq!(seconds("2m"), Ok(120));
        assert!(seconds("0").is_err() && seconds("1500ms").is_err() && seconds("2h").is_err());
        assert_eq!(seconds_f64("0.5"), Ok(0.5));
        assert_eq!(seconds_f64("500ms"), Ok(0.5));
        assert!(seconds_f64("0").is_err() && seconds_f64("nan").is_err());
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
