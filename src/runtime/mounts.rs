//! Host-path translation. When the director itself runs in a container with the Docker
//! socket mounted, a bind-mount source it names (e.g. `/cache`) is a path in *its* filesystem;
//! the engine needs the host path. The director finds its own container id in
//! `/proc/self/mountinfo` (Docker mounts `/etc/hostname` from `<data-root>/containers/<id>/`),
//! inspects itself, and maps each source by the longest matching mount destination.

/// One mount of the director's own container: where it is inside, and what backs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnMount {
    pub destination: String,
    /// A host path for bind mounts, a volume name for volumes.
    pub source: String,
    pub is_volume: bool,
}

/// The director's own container id, if it runs in a Docker container.
pub fn own_container_id(mountinfo: &str) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let idx = line.find("/containers/")?;
        let rest = &line[idx + "/containers/".len()..];
        let id: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
        (id.len() == 64 && rest[id.len()..].starts_with("/hostname")).then_some(id)
    })
}

/// The source the engine needs for `path` (a path inside the director's container):
/// `(source, is_volume)`, exactly, or why it cannot be had: a path no mount covers has no
/// known host path, and a sub-path of a named volume cannot be mounted by name (the whole
/// volume would be).
pub fn translate(path: &str, own: &[OwnMount]) -> Result<(String, bool), String> {
    let best = own
        .iter()
        .filter(|m| {
            path == m.destination
                || path.starts_with(&format!("{}/", m.destination.trim_end_matches('/')))
        })
        .max_by_key(|m| m.destination.len());
    match best {
        Some(m)
            if m.is_volume && path.trim_end_matches('/') == m.destination.trim_end_matches('/') =>
        {
            Ok((m.source.clone(), true))
        }
        Some(m) if m.is_volume => Err(format!(
            "`{path}` is inside the named volume `{}` (at {}); a volume is mounted whole, by name, so name {} instead",
            m.source, m.destination, m.destination
        )),
        Some(m) => {
            let rest = &path[m.destination.len()..];
            Ok((format!("{}{}", m.source.trim_end_matches('/'), rest), false))
        }
        None => Err(format!(
            "`{path}` is on no mount of the director's own container, so its host path is unknown"
        )),
    }
}

/// `source:target[:ro|rw]` from `runner.mounts`.
pub fn parse(spec: &str) -> Option<(String, String, bool)> {
    let mut parts = spec.split(':');
    let source = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let read_only = matches!(parts.next(), Some("ro"));
    Some((source, target, read_only))
}

/// `runner.mounts` with sources translated to host paths when the director itself runs in a
/// container (found through `/proc/self/mountinfo` and an inspect of itself).
///
/// A source that cannot be translated exactly is an error: no run starts with a mount that
/// would silently name another path on the host.
pub async fn translated(
    settings: &crate::settings::RunnerSettings,
    docker: Option<&bollard::Docker>,
) -> Result<Vec<(String, String, bool)>, String> {
    let parsed: Vec<_> = settings.mounts.iter().filter_map(|m| parse(m)).collect();
    let own_id = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|i| own_container_id(&i));
    let Some(id) = own_id else {
        // Not in a container: the sources are host paths already.
        return Ok(parsed);
    };
    if parsed.is_empty() {
        return Ok(parsed);
    }
    let Some(docker) = docker else {
        return Err(
            "the director runs in a container and cannot inspect it to translate runner.mounts"
                .into(),
        );
    };
    let own: Vec<OwnMount> = match docker.inspect_container(&id, None).await {
        Ok(c) => c
            .mounts
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| {
                let is_volume = m.name.is_some()
                    && m.typ
                        .as_ref()
                        .is_some_and(|t| format!("{t:?}").to_lowercase().contains("volume"));
                Some(OwnMount {
                    destination: m.destination?,
                    source: if is_volume { m.name? } else { m.source? },
                    is_volume,
                })
            })
            .collect(),
        Err(e) => {
            return Err(format!(
                "cannot inspect the director's own container to translate runner.mounts: {e}"
            ));
        }
    };
    parsed
        .into_iter()
        .map(|(source, target, ro)| {
            translate(&source, &own)
                .map(|(host, _)| (host, target, ro))
                .map_err(|e| format!("runner.mounts: {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_own_container_id_from_mountinfo() {
        let id = "a".repeat(64);
        let info = format!(
            "612 590 0:60 / / rw,relatime - overlay overlay rw\n\
             700 612 254:1 /var/lib/docker/containers/{id}/hostname /etc/hostname rw,relatime - ext4 /dev/vda rw\n"
        );
        assert_eq!(own_container_id(&info), Some(id));
        assert_eq!(
            own_container_id("612 590 0:60 / / rw - overlay overlay rw\n"),
            None
        );
    }

    #[test]
    fn translates_by_the_longest_matching_destination() {
        let own = vec![
            OwnMount {
                destination: "/data".into(),
                source: "/srv/director".into(),
                is_volume: false,
            },
            OwnMount {
                destination: "/data/cache".into(),
                source: "/mnt/fast/cache".into(),
                is_volume: false,
            },
            OwnMount {
                destination: "/vol".into(),
                source: "director-vol".into(),
                is_volume: true,
            },
        ];
        assert_eq!(
            translate("/data/cache/cargo", &own),
            Ok(("/mnt/fast/cache/cargo".into(), false))
        );
        assert_eq!(
            translate("/data/x", &own),
            Ok(("/srv/director/x".into(), false))
        );
        assert_eq!(
            translate("/data", &own),
            Ok(("/srv/director".into(), false))
        );
        assert_eq!(translate("/vol", &own), Ok(("director-vol".into(), true)));
        // No silent pass-through, no widening a sub-path to the whole volume.
        assert!(translate("/datax", &own).is_err_and(|e| e.contains("no mount")));
        assert!(translate("/elsewhere", &own).is_err());
        assert!(translate("/vol/sub", &own).is_err_and(|e| e.contains("mounted whole")));
    }

    #[test]
    fn parses_mount_specs() {
        assert_eq!(
            parse("/cache:/home/agent/.cache:ro"),
            Some(("/cache".into(), "/home/agent/.cache".into(), true))
        );
        assert_eq!(
            parse("/cache:/c"),
            Some(("/cache".into(), "/c".into(), false))
        );
    }
}
