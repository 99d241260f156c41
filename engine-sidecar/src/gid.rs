//! Finding the RoCEv2 GID index of the AINIC (or any RDMA NIC) from sysfs, for
//! `MC_GID_INDEX`, `NCCL_IB_GID_INDEX` and `MORI_IB_GID_INDEX` when `--gid-index` is not
//! given. Under `<sysfs>/class/infiniband/<dev>/ports/<port>/`, `gid_attrs/types/<i>`
//! names each GID's type (`RoCE v2`) and `gids/<i>` its value; unset entries read as all
//! zeros. The first RoCEv2 entry with an IPv4-mapped address is preferred (what RoCEv2
//! over IPv4 fabrics use), else the first RoCEv2 entry.

use std::path::Path;

const ZERO_GID: &str = "0000:0000:0000:0000:0000:0000:0000:0000";

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// A RoCEv2 GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoceGid {
    /// Its index (what `MC_GID_INDEX` and the others name).
    pub index: u32,
    /// Its value, e.g. `0000:0000:0000:0000:0000:ffff:0a00:0005`.
    pub gid: String,
}

impl RoceGid {
    /// The IPv4 address an IPv4-mapped GID carries (the rail's address).
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        let rest = self.gid.strip_prefix("0000:0000:0000:0000:0000:ffff:")?;
        let (hi, lo) = rest.split_once(':')?;
        let hi = u16::from_str_radix(hi, 16).ok()?;
        let lo = u16::from_str_radix(lo, 16).ok()?;
        Some(std::net::Ipv4Addr::from(
            (u32::from(hi) << 16) | u32::from(lo),
        ))
    }
}

/// The RoCEv2 GID of the first RDMA device and port that has one; ports whose `state`
/// says they are not ACTIVE are skipped.
pub fn detect_rocev2_gid(sysfs_root: &Path) -> Option<RoceGid> {
    let base = sysfs_root.join("class/infiniband");
    let mut devices: Vec<_> = std::fs::read_dir(&base)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    devices.sort();
    for dev in devices {
        let mut ports: Vec<_> = std::fs::read_dir(dev.join("ports"))
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        ports.sort();
        for port in ports {
            if read(&port.join("state")).is_some_and(|state| !state.contains("ACTIVE")) {
                continue;
            }
            let mut v2: Vec<(u32, String)> = Vec::new();
            let Ok(types) = std::fs::read_dir(port.join("gid_attrs/types")) else {
                continue;
            };
            for entry in types.filter_map(Result::ok) {
                let Some(index) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                if read(&entry.path()).is_some_and(|t| t.eq_ignore_ascii_case("RoCE v2"))
                    && let Some(gid) = read(&port.join("gids").join(index.to_string()))
                    && gid != ZERO_GID
                {
                    v2.push((index, gid));
                }
            }
            v2.sort();
            let ipv4_mapped = v2
                .iter()
                .find(|(_, gid)| gid.starts_with("0000:0000:0000:0000:0000:ffff:"));
            if let Some((index, gid)) = ipv4_mapped.or(v2.first()) {
                return Some(RoceGid {
                    index: *index,
                    gid: gid.clone(),
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect_gid_index(sysfs_root: &Path) -> Option<u32> {
        detect_rocev2_gid(sysfs_root).map(|g| g.index)
    }

    fn gid(dir: &Path, dev: &str, port: u32, index: u32, kind: &str, value: &str) {
        let p = dir.join(format!("class/infiniband/{dev}/ports/{port}"));
        std::fs::create_dir_all(p.join("gid_attrs/types")).unwrap();
        std::fs::create_dir_all(p.join("gids")).unwrap();
        std::fs::write(
            p.join(format!("gid_attrs/types/{index}")),
            format!("{kind}\n"),
        )
        .unwrap();
        std::fs::write(p.join(format!("gids/{index}")), format!("{value}\n")).unwrap();
    }

    #[test]
    fn prefers_the_ipv4_mapped_rocev2_entry() {
        let dir = tempfile::tempdir().unwrap();
        gid(
            dir.path(),
            "ionic_0",
            1,
            0,
            "IB/RoCE v1",
            "fe80:0000:0000:0000:0a00:27ff:fe00:0001",
        );
        gid(
            dir.path(),
            "ionic_0",
            1,
            1,
            "RoCE v2",
            "fe80:0000:0000:0000:0a00:27ff:fe00:0001",
        );
        gid(
            dir.path(),
            "ionic_0",
            1,
            2,
            "IB/RoCE v1",
            "0000:0000:0000:0000:0000:ffff:0a00:0005",
        );
        gid(
            dir.path(),
            "ionic_0",
            1,
            3,
            "RoCE v2",
            "0000:0000:0000:0000:0000:ffff:0a00:0005",
        );
        assert_eq!(detect_gid_index(dir.path()), Some(3));
        let found = detect_rocev2_gid(dir.path()).unwrap();
        assert_eq!(found.ipv4(), Some(std::net::Ipv4Addr::new(10, 0, 0, 5)));
    }

    #[test]
    fn ports_that_are_down_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let v4 = "0000:0000:0000:0000:0000:ffff:0a00:0105";
        gid(dir.path(), "ionic_0", 1, 1, "RoCE v2", v4);
        gid(dir.path(), "ionic_1", 1, 2, "RoCE v2", v4);
        let port = dir.path().join("class/infiniband/ionic_0/ports/1/state");
        std::fs::write(port, "1: DOWN\n").unwrap();
        let up = dir.path().join("class/infiniband/ionic_1/ports/1/state");
        std::fs::write(up, "4: ACTIVE\n").unwrap();
        assert_eq!(detect_gid_index(dir.path()), Some(2));
    }

    #[test]
    fn falls_back_to_the_first_rocev2_and_skips_unset_entries() {
        let dir = tempfile::tempdir().unwrap();
        gid(dir.path(), "rdma0", 1, 1, "RoCE v2", ZERO_GID);
        gid(
            dir.path(),
            "rdma0",
            1,
            5,
            "RoCE v2",
            "fe80:0000:0000:0000:0a00:27ff:fe00:0009",
        );
        assert_eq!(detect_gid_index(dir.path()), Some(5));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(detect_gid_index(empty.path()), None, "no NIC: no index");
    }
}
