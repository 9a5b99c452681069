//! Where a webhook may point. Any member names webhooks (a run's, a schedule's; an admin the
//! team's), and the coordinator POSTs to them from inside the fleet's network: so an address
//! on loopback, a private, shared or link-local network (the cloud's metadata service), or
//! unspecified, multicast or broadcast, is refused, unless the operator allow-lists its
//! network (`FLEET_WEBHOOK_ALLOW`, CIDRs separated by `,`: tests and fleets with receivers
//! inside use it). A URL is checked when it is named (every address its host resolves to) and
//! again at each delivery, by the client's own resolver: the addresses the client connects to
//! are the ones checked, so a name that resolves elsewhere later (DNS rebinding) gains nothing.

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// The delivery log's word for an address the policy refuses.
pub const NOT_ALLOWED: &str = "address not allowed";

/// The networks a webhook may reach beyond the public internet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    allow: Vec<(IpAddr, u8)>,
}

impl AddressPolicy {
    /// `FLEET_WEBHOOK_ALLOW`; an entry that does not parse is an error.
    pub fn from_env() -> Result<AddressPolicy, String> {
        AddressPolicy::parse(&std::env::var("FLEET_WEBHOOK_ALLOW").unwrap_or_default())
    }

    /// `10.0.0.0/8,127.0.0.1` (a bare address is its own network).
    pub fn parse(spec: &str) -> Result<AddressPolicy, String> {
        let mut allow = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (addr, bits) = entry.split_once('/').unwrap_or((entry, ""));
            let bad = || format!("FLEET_WEBHOOK_ALLOW: `{entry}` is not an address or a CIDR");
            let addr: IpAddr = addr.parse().map_err(|_| bad())?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let bits = match bits {
                "" => max,
                b => b.parse::<u8>().ok().filter(|b| *b <= max).ok_or_else(bad)?,
            };
            allow.push((addr, bits));
        }
        Ok(AddressPolicy { allow })
    }

    /// Whether a webhook may reach `ip`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        !internal(ip) || self.allow.iter().any(|(net, bits)| within(ip, *net, *bits))
    }

    /// Checks `url` as it is named: every address its host resolves to now must be allowed.
    pub async fn check_url(&self, url: &str) -> Result<(), String> {
        let parsed =
            reqwest::Url::parse(url).map_err(|e| format!("the url does not parse: {e}"))?;
        let host = parsed.host_str().ok_or("the url has no host")?;
        let port = parsed.port_or_known_default().unwrap_or(80);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|_| "the url's host does not resolve".to_string())?
                .collect(),
        };
        if addrs.is_empty() {
            return Err("the url's host does not resolve".into());
        }
        if addrs.iter().any(|a| !self.allows(a.ip())) {
            return Err(format!(
                "the url's host is on a loopback, private, link-local or otherwise internal \
                 address ({NOT_ALLOWED}); an operator allows such networks with \
                 FLEET_WEBHOOK_ALLOW"
            ));
        }
        Ok(())
    }
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// Whether `ip` lies in `net/bits`.
fn within(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, canonical(net)) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Loopback, private, shared (CGNAT), link-local, unspecified, multicast, broadcast,
/// documentation and benchmarking addresses, and IPv6's unique-local and site-local ones.
fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => internal_v6(v6),
    }
}

fn internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240
}

fn internal_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first & 0xffc0) == 0xfec0
        || ip
            .to_ipv4()
            .is_some_and(|v4| ip.segments()[..6] == [0; 6] && internal_v4(v4))
}

/// The webhook client's resolver: the system's answer with every address the policy refuses
/// left out (none left: an error, so nothing is connected to).
#[derive(Clone)]
pub struct GuardedResolver {
    pub policy: Arc<AddressPolicy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let kept: Vec<SocketAddr> = found.filter(|a| policy.allows(a.ip())).collect();
            if kept.is_empty() {
                return Err(NOT_ALLOWED.into());
            }
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn internal_addresses_are_refused_unless_allowed() {
        let none = AddressPolicy::default();
        for bad in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(!none.allows(ip(bad)), "{bad}");
        }
        for good in ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"] {
            assert!(none.allows(ip(good)), "{good}");
        }
        let some = AddressPolicy::parse("127.0.0.1, 10.0.0.0/8").unwrap();
        assert!(some.allows(ip("127.0.0.1")) && some.allows(ip("10.200.0.9")));
        assert!(!some.allows(ip("127.0.0.2")) && !some.allows(ip("169.254.169.254")));
        assert!(AddressPolicy::parse("10.0.0.0/33").is_err());
        assert!(AddressPolicy::parse("intranet").is_err());
    }

    #[tokio::test]
    async fn a_url_is_checked_by_every_address_its_host_has() {
        let none = AddressPolicy::default();
        for url in [
            "http://127.0.0.1:6379/",
            "http://localhost:8080/x",
            "http://[::1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://0x7f000001/",
        ] {
            let e = none.check_url(url).await.unwrap_err();
            assert!(e.contains(NOT_ALLOWED), "{url}: {e}");
        }
        let local = AddressPolicy::parse("127.0.0.0/8").unwrap();
        assert!(local.check_url("http://127.0.0.1:9/hook").await.is_ok());
    }
}
