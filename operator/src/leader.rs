//! Leader election on a `coordination.k8s.io/v1` Lease: one replica reconciles, the
//! others wait and take over when the holder stops renewing. Updates carry the Lease's
//! `resourceVersion`, so two candidates can never both win a round.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use std::time::Duration;

/// Lease timings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// How long a lease holds without renewal.
    pub duration: Duration,
    /// How often the holder renews (and candidates retry).
    pub retry: Duration,
}

/// What a candidate should do with the Lease it read (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it (or the holder let it expire): take it.
    Take,
    /// We hold it: renew.
    Renew,
    /// Someone else holds it.
    Wait,
}

/// When this replica first saw the Lease's current holder and renew time: expiry is
/// timed on this replica's own clock from that moment, so clock skew between replicas
/// cannot end a live holder's term early (what client-go does).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    record: Option<(Option<String>, Option<String>)>,
    since: Option<std::time::Instant>,
}

impl Observed {
    /// Notes the Lease's record; returns how long it has stayed unchanged.
    pub fn see(&mut self, spec: Option<&LeaseSpec>, now: std::time::Instant) -> Duration {
        let record = spec.map(|s| {
            (
                s.holder_identity.clone(),
                s.renew_time.as_ref().map(|t| t.0.to_string()),
            )
        });
        if self.record != Some(record.clone().unwrap_or_default()) || self.since.is_none() {
            self.record = Some(record.unwrap_or_default());
            self.since = Some(now);
        }
        self.since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }
}

/// Decides from the Lease's spec and how long its record has been unchanged.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Decision {
    let Some(spec) = spec else {
        return Decision::Take;
    };
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == identity => Decision::Renew,
        None | Some("") => Decision::Take,
        Some(_) => {
            let ttl = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15),
            );
            if unchanged_for > ttl {
                Decision::Take
            } else {
                Decision::Wait
            }
        }
    }
}

fn spec_for(
    cfg: &LeaseConfig,
    previous: Option<&LeaseSpec>,
    now: Timestamp,
    taking: bool,
) -> LeaseSpec {
    let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(i32::try_from(cfg.duration.as_secs()).unwrap_or(15)),
        acquire_time: if taking {
            Some(MicroTime(now))
        } else {
            previous.and_then(|s| s.acquire_time.clone())
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if taking && previous.is_some() {
            transitions + 1
        } else {
            transitions
        }),
        ..Default::default()
    }
}

/// One round: read, decide, write. `Ok(true)`: we hold the Lease now.
pub async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Observed,
) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let current = api.get_opt(&cfg.name).await?;
    let Some(mut lease) = current else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..Default::default()
            },
            spec: Some(spec_for(cfg, None, now, true)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let unchanged_for = observed.see(lease.spec.as_ref(), std::time::Instant::now());
    let decision = decide(lease.spec.as_ref(), &cfg.identity, unchanged_for);
    if decision == Decision::Wait {
        return Ok(false);
    }
    lease.spec = Some(spec_for(
        cfg,
        lease.spec.as_ref(),
        now,
        decision == Decision::Take,
    ));
    // replace carries resourceVersion: a concurrent writer makes this a 409.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// One round, bounded in time: a hung API call must not keep a replica reconciling past
/// its lease (a third of the duration, then it counts as a failed renewal).
async fn round(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Observed,
) -> Result<bool, kube::Error> {
    let limit = cfg.duration / 3;
    match tokio::time::timeout(limit, try_acquire_or_renew(api, cfg, observed)).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service(
            format!("no answer within {limit:?}").into(),
        )),
    }
}

/// Waits until this replica holds the Lease.
pub async fn acquire(client: &Client, cfg: &LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut logged = false;
    let mut observed = Observed::default();
    loop {
        match round(&api, cfg, &mut observed).await {
            Ok(true) => {
                tracing::info!(lease = %cfg.name, namespace = %cfg.namespace, identity = %cfg.identity, "became the leader");
                return;
            }
            Ok(false) if !logged => {
                tracing::info!(lease = %cfg.name, "another replica leads; waiting to take over");
                logged = true;
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(lease = %cfg.name, "leader election: {e}"),
        }
        tokio::time::sleep(cfg.retry).await;
    }
}

/// Renews the Lease until a renewal has failed for longer than its duration (another
/// replica may lead now); then returns, and the caller must stop reconciling.
pub async fn hold(client: &Client, cfg: &LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut last_ok = std::time::Instant::now();
    let mut observed = Observed::default();
    loop {
        tokio::time::sleep(cfg.retry).await;
        match round(&api, cfg, &mut observed).await {
            Ok(true) => last_ok = std::time::Instant::now(),
            Ok(false) => {
                tracing::error!(lease = %cfg.name, "lost the leader Lease to another replica");
                return;
            }
            Err(e) => tracing::warn!(lease = %cfg.name, "renewing the leader Lease: {e}"),
        }
        if last_ok.elapsed() > cfg.duration {
            tracing::error!(lease = %cfg.name, "could not renew the leader Lease for {:?}", cfg.duration);
            return;
        }
    }
}

/// Gives the Lease up on a clean shutdown so a standby takes over at once.
pub async fn release(client: &Client, cfg: &LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    if let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await
        && let Some(spec) = lease.spec.as_mut()
        && spec.holder_identity.as_deref() == Some(cfg.identity.as_str())
    {
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        if let Err(e) = api.replace(&cfg.name, &PostParams::default(), &lease).await {
            tracing::warn!("releasing the leader Lease: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    fn spec(holder: Option<&str>, renewed_secs_ago: i64) -> LeaseSpec {
        let now = Timestamp::now();
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
            ..Default::default()
        }
    }

    #[test]
    fn a_live_lease_of_another_holder_is_respected_until_it_expires() {
        let secs = Duration::from_secs;
        assert_eq!(decide(None, "me", secs(0)), Decision::Take);
        assert_eq!(
            decide(Some(&spec(Some("me"), 1)), "me", secs(0)),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&spec(Some("other"), 5)), "me", secs(5)),
            Decision::Wait
        );
        assert_eq!(
            decide(Some(&spec(Some("other"), 16)), "me", secs(16)),
            Decision::Take
        );
        assert_eq!(decide(Some(&spec(None, 1)), "me", secs(0)), Decision::Take);
    }

    #[test]
    fn expiry_is_timed_on_this_replicas_clock_not_the_holders() {
        let t0 = std::time::Instant::now();
        let mut seen = Observed::default();
        // The holder's renew time is an hour old by our clock (skew): still live until
        // we have seen the record unchanged for a whole lease duration.
        let stale = spec(Some("other"), 3600);
        assert_eq!(seen.see(Some(&stale), t0), Duration::ZERO);
        let d = seen.see(Some(&stale), t0 + Duration::from_secs(10));
        assert_eq!(decide(Some(&stale), "me", d), Decision::Wait);
        let d = seen.see(Some(&stale), t0 + Duration::from_secs(16));
        assert_eq!(decide(Some(&stale), "me", d), Decision::Take);
        // A renewal resets the clock.
        let renewed = spec(Some("other"), 3590);
        assert_eq!(
            seen.see(Some(&renewed), t0 + Duration::from_secs(17)),
            Duration::ZERO
        );
    }
}
