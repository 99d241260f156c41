//! The autoscaler: each deployment with `spec.autoscaling` is looked at every
//! `intervalSeconds`. A look reads the signals off its pods ([`scrape`], [`signals`]),
//! decides each role's workers ([`decide`], pure) and, when they change, writes them
//! (`spec.replicas`, or `spec.serving.roleReplicas` when disaggregated) with an Event
//! saying why; every look ends in `status.autoscaling`. It stands down while a
//! HorizontalPodAutoscaler targets the deployment. It runs beside the controllers, on
//! the leader only.

pub mod decide;
pub mod ownership;
pub mod scrape;
pub mod signals;

use crate::api::resolve::{Workers, resolve_workers};
use crate::api::{
    AutoscalingSpec, AutoscalingStatus, InferaDeployment, ObservedRole, ObservedSignals,
    PDTopology, ServingMode,
};
use crate::names::Role;
use decide::{History, Policy, RoleDecision, RoleSignals, Signals, decide, round};
use futures::StreamExt;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use signals::{Buckets, GatewayLatency, add, quantile, since};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The field manager of what the autoscaler writes.
pub const FIELD_MANAGER: &str = "infera-autoscaler";

/// How often the deployments are checked for a look that is due.
const TICK: Duration = Duration::from_secs(1);

/// What the autoscaler remembers of one deployment between looks.
#[derive(Default)]
struct Memory {
    history: History,
    gateways: HashMap<String, GatewayLatency>,
    /// Per role, the most requests one worker ran while its queue was not empty.
    seats: HashMap<Role, f64>,
    last: Option<Instant>,
    /// When `status.autoscaling` was last written.
    written: Option<Instant>,
    /// Per role, when it was last seen with workers not ready (or last changed).
    unsettled: HashMap<Role, Instant>,
    /// Whether the autoscaler held the count after its last look.
    held: bool,
    /// When another manager's apply last took the count from it, and who.
    undone: Option<(Instant, Vec<String>)>,
}

/// How long `status.autoscaling.message` keeps saying that another manager took the
/// count back (the Warning Event stays in the events).
const UNDONE_SHOWN: Duration = Duration::from_secs(600);

struct Autoscaler {
    client: Client,
    http: reqwest::Client,
    recorder: Recorder,
    epoch: Instant,
}

/// A look that could not finish (tried again at the next interval).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
struct LookError {
    what: &'static str,
    #[source]
    source: kube::Error,
}

fn step<T>(what: &'static str, r: Result<T, kube::Error>) -> Result<T, LookError> {
    r.map_err(|source| LookError { what, source })
}

/// Runs until `shutdown` resolves.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    instance: String,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let http = match reqwest::Client::builder()
        // Gateways serving TLS present a certificate for their Service, not for the pod
        // address scraped; only their public metrics are read.
        .danger_accept_invalid_certs(true)
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("autoscaler: no HTTP client: {e}");
            return;
        }
    };
    let api: Api<InferaDeployment> = match namespace.as_deref() {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store();
    let watch = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .touched_objects()
        .for_each(|_| async {});
    let autoscaler = Autoscaler {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(instance),
            },
        ),
        client,
        http,
        epoch: Instant::now(),
    };
    let looks = autoscaler.looks(store);
    tokio::select! {
        _ = shutdown => {}
        _ = watch => {}
        _ = looks => {}
    }
}

impl Autoscaler {
    async fn looks(&self, store: Store<InferaDeployment>) {
        let mut memory: HashMap<String, Memory> = HashMap::new();
        loop {
            tokio::time::sleep(TICK).await;
            let deployments = store.state();
            memory.retain(|uid, _| deployments.iter().any(|d| d.uid().as_ref() == Some(uid)));
            for idep in deployments {
                let Some(policy) = &idep.spec.autoscaling else {
                    continue;
                };
                let uid = idep.uid().unwrap_or_default();
                let m = memory.entry(uid).or_default();
                let interval = Duration::from_secs(u64::from(policy.interval_seconds));
                if m.last.is_some_and(|t| t.elapsed() < interval) {
                    continue;
                }
                m.last = Some(Instant::now());
                if let Err(e) = self.look(&idep, policy, m).await {
                    tracing::warn!(deployment = %idep.name_any(), namespace = ?idep.namespace(), "autoscaler: {e}");
                }
            }
        }
    }

    async fn look(
        &self,
        idep: &InferaDeployment,
        spec: &AutoscalingSpec,
        memory: &mut Memory,
    ) -> Result<(), LookError> {
        let ns = idep.namespace().unwrap_or_default();
        let name = idep.name_any();
        let api = Api::<InferaDeployment>::namespaced(self.client.clone(), &ns);
        let previous = idep.status.as_ref().and_then(|s| s.autoscaling.clone());
        if let Some(hpa) = step(
            "listing HorizontalPodAutoscalers",
            hpa_targeting(&self.client, &ns, &name).await,
        )? {
            return self.stand_down(idep, &api, &hpa, previous).await;
        }
        let topology = match (&idep.spec.serving.mode, &idep.spec.serving.topology_ref) {
            (ServingMode::Disaggregated, Some(t)) => step(
                "reading the PDTopology",
                Api::<PDTopology>::namespaced(self.client.clone(), &ns)
                    .get_opt(t)
                    .await,
            )?,
            _ => None,
        };
        let workers = match resolve_workers(
            &idep.spec,
            topology
                .as_ref()
                .map(|t| (t.metadata.name.as_deref().unwrap_or_default(), &t.spec)),
        ) {
            Ok(w) => w,
            // The reconcile reports why in Degraded; nothing to size.
            Err(_) => return Ok(()),
        };
        let current: Vec<(Role, u32)> = match workers {
            Workers::Mixed(n) => vec![(Role::Mixed, n)],
            Workers::Disaggregated {
                prefill, decode, ..
            } => vec![(Role::Prefill, prefill), (Role::Decode, decode)],
        };
        let engines = step(
            "listing engine pods",
            scrape::engines(&self.client, &self.http, &ns, &name).await,
        )?;
        // A gateway's /metrics wants a key only with both set; the operator holds none.
        let locked = idep.spec.gateway.metrics_require_auth
            && idep.spec.gateway.api_keys_secret_ref.is_some();
        let gateways = if locked {
            Vec::new()
        } else {
            step(
                "listing gateway pods",
                scrape::gateways(
                    &self.client,
                    &self.http,
                    &ns,
                    &name,
                    idep.spec.gateway.tls.is_some(),
                )
                .await,
            )?
        };
        let latency = interval_latency(&gateways, &memory.gateways);
        memory.gateways = gateways.into_iter().collect();
        let status = idep.status.clone().unwrap_or_default();
        let settle = 2 * Duration::from_secs(u64::from(spec.interval_seconds));
        let roles: Vec<RoleSignals> = current
            .iter()
            .map(|&(role, n)| {
                let seats = memory.seats.get(&role).copied();
                let mut s = role_signals(role, n, &engines, &status.roles, seats);
                add_gateway_queue(&mut s, memory.gateways.values());
                if s.ready < s.current {
                    memory.unsettled.insert(role, Instant::now());
                }
                s.settled = s.ready >= s.current
                    && memory
                        .unsettled
                        .get(&role)
                        .is_none_or(|t| t.elapsed() >= settle);
                s
            })
            .collect();
        let mut signals = Signals {
            ttft_p90: latency.ttft_p90,
            itl_p90: latency.itl_p90,
            prefill_p90: latency.prefill_p90,
            // The spec changed and the reconcile has not caught up, or an engine rollout
            // runs (its surge pods are not capacity to size on).
            rollout: idep.metadata.generation != status.observed_generation
                || status.rollout.is_some(),
            roles,
        };
        let saturated: Vec<Role> = signals
            .roles
            .iter()
            .filter(|r| decide::over_latency_target(&spec.targets, &signals, r))
            .map(|r| r.role)
            .collect();
        learn_seats(&mut memory.seats, &engines, &saturated);
        for r in &mut signals.roles {
            r.seats = memory.seats.get(&r.role).copied();
        }
        let observed = observed(&signals, &engines);
        let answered = engines.iter().any(|(_, l)| l.is_some());
        let policy = Policy {
            min: spec.min_replicas,
            // The schema keeps min <= max; a server without CEL does not.
            max: spec.max_replicas.max(spec.min_replicas),
            targets: spec.targets.clone(),
            up_window: f64::from(spec.scale_up_stabilization_seconds),
            down_window: f64::from(spec.scale_down_stabilization_seconds),
        };
        let now = self.epoch.elapsed().as_secs_f64();
        let (decisions, history) = decide(&policy, &signals, &memory.history, now);
        memory.history = history;
        let changed: Vec<&RoleDecision> = decisions
            .iter()
            .filter(|d| d.desired != d.current)
            .collect();
        let managed = idep.metadata.managed_fields.as_deref().unwrap_or_default();
        let held = ownership::held_path(&idep.spec.serving.mode);
        let undone_by = ownership::undone_by(managed, held, memory.held);
        let newly_undone = !undone_by.is_empty();
        if newly_undone {
            memory.undone = Some((Instant::now(), undone_by));
        }
        let base = match (answered, locked) {
            (false, _) => "no engine pod answered on /metrics; the workers stay as they are",
            (true, false) => "the operator sizes the workers on spec.autoscaling.targets",
            (true, true) => {
                "the operator sizes the workers on the engines' signals; the TTFT and inter-token targets are not used: the gateways' /metrics need an API key (spec.gateway.metricsRequireAuth)"
            }
        };
        let message = match &memory.undone {
            Some((at, who)) if at.elapsed() < UNDONE_SHOWN => format!(
                "{base}; {field} was applied by {who} over the autoscaler's count: each of its syncs undoes the autoscaler's changes, leave {field} out of what {who} applies",
                field = ownership::held_name(&idep.spec.serving.mode),
                who = who.join(", "),
            ),
            _ => base.to_owned(),
        };
        let mut next = AutoscalingStatus {
            state: if answered { "Active" } else { "NoSignals" }.into(),
            message: message.clone(),
            last_decision: if answered {
                summary(&decisions)
            } else {
                "nothing decided".into()
            },
            last_look_time: Some(crate::clock::now()),
            last_scale_time: previous.as_ref().and_then(|p| p.last_scale_time.clone()),
            last_scale: previous.as_ref().and_then(|p| p.last_scale.clone()),
            next_scale_in_time: decisions
                .iter()
                .filter_map(|d| d.next_scale_in)
                .reduce(f64::min)
                .map(|t| wall_time(t - now)),
            observed: Some(observed),
        };
        // The count is applied under the autoscaler's field manager when it changes,
        // and once when it is set but held by others only, so the autoscaler owns it
        // too (see [`ownership`]).
        let present = match idep.spec.serving.mode {
            ServingMode::Mixed => true,
            ServingMode::Disaggregated => idep.spec.serving.role_replicas.is_some(),
        };
        let unheld = present && !ownership::held_by_autoscaler(managed, held);
        let applies = answered && (!changed.is_empty() || unheld);
        memory.held = applies || ownership::held_by_autoscaler(managed, held);
        if applies {
            step(
                "applying the workers",
                apply_workers(
                    &api,
                    &name,
                    &idep.spec.serving.mode,
                    Some(counts(&decisions)),
                )
                .await,
            )?;
        }
        if answered && !changed.is_empty() {
            let what = changed
                .iter()
                .map(|d| format!("{} {} -> {}", d.role.as_str(), d.current, d.desired))
                .collect::<Vec<_>>()
                .join(", ");
            tracing::info!(deployment = %name, namespace = %ns, "autoscaled {what}: {}", next.last_decision);
            for d in &changed {
                memory.unsettled.insert(d.role, Instant::now());
            }
            next.last_scale_time = Some(crate::clock::now());
            next.last_scale = Some(what.clone());
            let out = changed.iter().any(|d| d.desired > d.current);
            // The change in the action: Events of one action are folded into one series
            // that keeps its first note.
            self.publish(
                idep,
                if out { "ScaledOut" } else { "ScaledIn" },
                &format!("Scale {what}"),
                &next.last_decision,
            )
            .await;
        }
        if newly_undone {
            self.publish_as(
                EventType::Warning,
                idep,
                "CountAppliedElsewhere",
                "Autoscale",
                &message,
            )
            .await;
        }
        if previous.as_ref().map(|p| p.state.as_str()) != Some(next.state.as_str())
            && next.state == "NoSignals"
        {
            self.publish(idep, "AutoscalerNoSignals", "Autoscale", &next.message)
                .await;
        }
        if !worth_writing(
            previous.as_ref(),
            &next,
            memory.written.map(|t| t.elapsed()),
        ) {
            return Ok(());
        }
        step(
            "writing status.autoscaling",
            write_status(&api, &name, &next).await,
        )?;
        memory.written = Some(Instant::now());
        Ok(())
    }

    async fn stand_down(
        &self,
        idep: &InferaDeployment,
        api: &Api<InferaDeployment>,
        hpa: &str,
        previous: Option<AutoscalingStatus>,
    ) -> Result<(), LookError> {
        let name = idep.name_any();
        let managed = idep.metadata.managed_fields.as_deref().unwrap_or_default();
        let role_replicas = ownership::held_path(&ServingMode::Disaggregated);
        if idep.spec.serving.mode == ServingMode::Disaggregated
            && ownership::held_by_autoscaler(managed, role_replicas)
        {
            // The HorizontalPodAutoscaler counts topology units in spec.replicas: the
            // autoscaler lets go of roleReplicas (removed where it alone held them).
            step(
                "releasing spec.serving.roleReplicas",
                apply_workers(api, &name, &ServingMode::Disaggregated, None).await,
            )?;
        } else if idep.spec.serving.role_replicas.is_some() {
            // Set by an earlier autoscaler's merge patch (or by hand): cleared.
            step(
                "clearing spec.serving.roleReplicas",
                api.patch(
                    &name,
                    &PatchParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &Patch::Merge(&json!({"spec": {"serving": {"roleReplicas": null}}})),
                )
                .await,
            )?;
        }
        let message = format!(
            "HorizontalPodAutoscaler {hpa} targets this deployment's /scale: it sets spec.replicas and the operator does not scale"
        );
        let next = AutoscalingStatus {
            state: "StoodDown".into(),
            message: message.clone(),
            last_decision: String::new(),
            last_look_time: Some(crate::clock::now()),
            ..previous.clone().unwrap_or_default()
        };
        if previous.map(|p| p.state) != Some(next.state.clone()) {
            self.publish(idep, "AutoscalerStoodDown", "Autoscale", &message)
                .await;
        }
        step(
            "writing status.autoscaling",
            write_status(api, &name, &next).await,
        )
    }

    async fn publish(&self, idep: &InferaDeployment, reason: &str, action: &str, note: &str) {
        self.publish_as(EventType::Normal, idep, reason, action, note)
            .await;
    }

    async fn publish_as(
        &self,
        type_: EventType,
        idep: &InferaDeployment,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.chars().take(128).collect(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &idep.object_ref(&())).await {
            tracing::warn!("publishing event {reason}: {e}");
        }
    }
}

/// How often the signals in `status.autoscaling` are refreshed when nothing else
/// changed: each write wakes the deployment's reconcile.
const REFRESH: Duration = Duration::from_secs(30);

/// Whether a look's status is worth a write: the state, the last change or a waiting
/// scale-in's time changed, or the signals shown are older than [`REFRESH`].
fn worth_writing(
    previous: Option<&AutoscalingStatus>,
    next: &AutoscalingStatus,
    since_written: Option<Duration>,
) -> bool {
    let Some(p) = previous else {
        return true;
    };
    p.state != next.state
        || p.message != next.message
        || p.last_scale_time != next.last_scale_time
        || p.next_scale_in_time.is_some() != next.next_scale_in_time.is_some()
        || since_written.is_none_or(|s| s >= REFRESH)
}

/// The name of a HorizontalPodAutoscaler whose target is deployment `name`.
async fn hpa_targeting(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, kube::Error> {
    let hpas = Api::<HorizontalPodAutoscaler>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    Ok(hpas.items.iter().find_map(|h| {
        let target = &h.spec.as_ref()?.scale_target_ref;
        let ours = target.kind == "InferaDeployment"
            && target.name == name
            && target
                .api_version
                .as_deref()
                .is_some_and(|v| v.starts_with(crate::api::GROUP));
        ours.then(|| h.name_any())
    }))
}

/// Latency percentiles of the last interval, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Latency {
    ttft_p90: Option<f64>,
    itl_p90: Option<f64>,
    /// Of the prefill legs (disaggregated).
    prefill_p90: Option<f64>,
}

/// TTFT, inter-token and prefill-leg p90 of the last interval, over the gateways seen
/// before (a gateway's first scrape only sets its baseline; a prefill worker's first
/// series counts whole). When those gateways answered no request at all, all are 0:
/// an idle deployment is under any latency target.
fn interval_latency(
    now: &[(String, GatewayLatency)],
    before: &HashMap<String, GatewayLatency>,
) -> Latency {
    let mut ttft = Buckets::new();
    let mut itl = Buckets::new();
    let mut prefill = Buckets::new();
    let mut requests = Buckets::new();
    let mut baselined = false;
    for (uid, latency) in now {
        let Some(earlier) = before.get(uid) else {
            continue;
        };
        baselined = true;
        ttft = add(&ttft, &since(&latency.ttft, Some(&earlier.ttft)));
        itl = add(&itl, &since(&latency.itl, Some(&earlier.itl)));
        for (worker, legs) in &latency.prefill {
            prefill = add(&prefill, &since(legs, earlier.prefill.get(worker)));
        }
        requests = add(
            &requests,
            &since(&latency.requests, Some(&earlier.requests)),
        );
    }
    let answered = requests.last().map_or(0.0, |(_, n)| *n);
    if baselined && answered <= 0.0 {
        let idle = Some(0.0);
        return Latency {
            ttft_p90: idle,
            itl_p90: idle,
            prefill_p90: idle,
        };
    }
    Latency {
        ttft_p90: quantile(0.9, &ttft),
        itl_p90: quantile(0.9, &itl),
        prefill_p90: quantile(0.9, &prefill),
    }
}

/// Remembers, per role, the most requests a worker ran while requests waited in its
/// queue, or while the role missed a latency target (`saturated`; a prefill worker's
/// queue empties at every step, so only its latency shows it full): what one worker
/// holds at once.
fn learn_seats(
    seats: &mut HashMap<Role, f64>,
    engines: &[(Role, Option<signals::EngineLoad>)],
    saturated: &[Role],
) {
    for (role, load) in engines {
        let Some(load) = load else { continue };
        let full = load.waiting.unwrap_or(0.0) > 0.0 || saturated.contains(role);
        if let Some(running) = load.running
            && full
            && running > 0.0
        {
            let seen = seats.entry(*role).or_insert(running);
            *seen = seen.max(running);
        }
    }
}

/// Requests flow control holds in the gateways for the role count as waiting: they
/// left no engine's queue to be counted in.
fn add_gateway_queue<'g>(s: &mut RoleSignals, gateways: impl Iterator<Item = &'g GatewayLatency>) {
    let held: f64 = gateways.filter_map(|g| g.queued.get(s.role.as_str())).sum();
    if held > 0.0 {
        s.waiting = Some(s.waiting.unwrap_or(0.0) + held);
    }
}

fn role_signals(
    role: Role,
    current: u32,
    engines: &[(Role, Option<signals::EngineLoad>)],
    status: &[crate::api::RoleStatus],
    seats: Option<f64>,
) -> RoleSignals {
    let loads: Vec<&signals::EngineLoad> = engines
        .iter()
        .filter(|(r, _)| *r == role)
        .filter_map(|(_, l)| l.as_ref())
        .collect();
    let sum = |f: fn(&signals::EngineLoad) -> Option<f64>| {
        let values: Vec<f64> = loads.iter().filter_map(|l| f(l)).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>())
    };
    let kv_reports = loads.iter().filter(|l| l.kv_usage.is_some()).count();
    let kv = sum(|l| l.kv_usage).map(|s| s / kv_reports.max(1) as f64);
    let mut of_role = engines.iter().filter(|(r, _)| *r == role).peekable();
    let complete = of_role.peek().is_some() && of_role.all(|(_, l)| l.is_some());
    let ready = status
        .iter()
        .find(|s| s.role == role.as_str() && s.replicas == current as i32)
        .map_or(0, |s| u32::try_from(s.ready_replicas).unwrap_or(0));
    RoleSignals {
        role,
        current,
        ready,
        waiting: sum(|l| l.waiting),
        kv_usage: kv,
        running: sum(|l| l.running),
        seats,
        complete,
        settled: ready >= current,
    }
}

fn observed(signals: &Signals, engines: &[(Role, Option<signals::EngineLoad>)]) -> ObservedSignals {
    ObservedSignals {
        ttft_p90_seconds: signals.ttft_p90.map(round),
        itl_p90_seconds: signals.itl_p90.map(round),
        prefill_p90_seconds: signals.prefill_p90.map(round),
        roles: signals
            .roles
            .iter()
            .map(|r| ObservedRole {
                role: r.role.as_str().into(),
                replicas: r.current,
                scraped: engines
                    .iter()
                    .filter(|(role, l)| *role == r.role && l.is_some())
                    .count() as u32,
                waiting_per_worker: r.waiting.map(|w| round(w / f64::from(r.current.max(1)))),
                running: r.running,
                kv_usage: r.kv_usage.map(round),
            })
            .collect(),
    }
}

fn summary(decisions: &[RoleDecision]) -> String {
    decisions
        .iter()
        .map(|d| {
            let counts = if d.desired == d.current {
                format!("{} at {}", d.role.as_str(), d.current)
            } else {
                format!("{} {} -> {}", d.role.as_str(), d.current, d.desired)
            };
            format!("{counts}: {}", d.reason)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The decided workers: the mixed count, or prefill and decode.
fn counts(decisions: &[RoleDecision]) -> (u32, u32) {
    let of = |role: Role| {
        decisions
            .iter()
            .find(|d| d.role == role)
            .map_or(0, |d| d.desired)
    };
    match decisions.iter().any(|d| d.role == Role::Mixed) {
        true => (of(Role::Mixed), 0),
        false => (of(Role::Prefill), of(Role::Decode)),
    }
}

/// Applies the workers (`None`: holds none) under the autoscaler's field manager,
/// forcing: the autoscaler's decision wins over another owner's value.
async fn apply_workers(
    api: &Api<InferaDeployment>,
    name: &str,
    mode: &ServingMode,
    counts: Option<(u32, u32)>,
) -> Result<(), kube::Error> {
    let config = ownership::build_apply(
        &InferaDeployment::api_version(&()),
        &InferaDeployment::kind(&()),
        name,
        mode,
        counts,
    );
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&config),
    )
    .await
    .map(|_| ())
}

fn wall_time(in_seconds: f64) -> Time {
    let now = crate::clock::now();
    let later = now
        .0
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
            in_seconds.ceil() as i64,
        ))
        .unwrap_or(now.0);
    Time(later)
}

async fn write_status(
    api: &Api<InferaDeployment>,
    name: &str,
    status: &AutoscalingStatus,
) -> Result<(), kube::Error> {
    let patch = json!({
        "apiVersion": InferaDeployment::api_version(&()),
        "kind": InferaDeployment::kind(&()),
        "status": {"autoscaling": status},
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(role: Role, current: u32, desired: u32) -> RoleDecision {
        RoleDecision {
            role,
            current,
            desired,
            reason: "why".into(),
            next_scale_in: None,
        }
    }

    #[test]
    fn counts_are_the_mixed_count_or_prefill_and_decode() {
        assert_eq!(counts(&[decision(Role::Mixed, 1, 3)]), (3, 0));
        assert_eq!(
            counts(&[decision(Role::Prefill, 1, 2), decision(Role::Decode, 2, 1)]),
            (2, 1)
        );
        assert_eq!(
            summary(&[decision(Role::Prefill, 1, 2), decision(Role::Decode, 2, 2)]),
            "prefill 1 -> 2: why; decode at 2: why"
        );
    }

    #[test]
    fn status_is_written_on_a_change_or_to_refresh_the_signals() {
        let seen = AutoscalingStatus {
            state: "Active".into(),
            last_decision: "mixed at 1: within 10%".into(),
            ..Default::default()
        };
        let fresher = AutoscalingStatus {
            last_decision: "mixed at 1: within 10% (newer numbers)".into(),
            ..seen.clone()
        };
        let soon = Some(Duration::from_secs(2));
        assert!(worth_writing(None, &seen, None));
        assert!(!worth_writing(Some(&seen), &fresher, soon));
        assert!(worth_writing(Some(&seen), &fresher, Some(REFRESH)));
        let scaled = AutoscalingStatus {
            last_scale_time: Some(crate::clock::now()),
            ..fresher.clone()
        };
        assert!(worth_writing(Some(&seen), &scaled, soon));
        let stood_down = AutoscalingStatus {
            state: "StoodDown".into(),
            ..fresher
        };
        assert!(worth_writing(Some(&seen), &stood_down, soon));
    }

    #[test]
    fn latency_counts_only_gateways_seen_before_and_idle_is_zero() {
        let g = |n: f64, answered: f64| GatewayLatency {
            ttft: vec![(0.5, n), (f64::INFINITY, n)],
            itl: Vec::new(),
            requests: vec![(f64::INFINITY, answered)],
            ..GatewayLatency::default()
        };
        let before = HashMap::from([("a".to_owned(), g(10.0, 10.0))]);
        // 4 streamed first tokens in (0, 0.5]: p90 at 0.45; b only sets its baseline.
        let now = vec![
            ("a".to_owned(), g(14.0, 14.0)),
            ("b".to_owned(), g(100.0, 100.0)),
        ];
        let l = interval_latency(&now, &before);
        assert!((l.ttft_p90.unwrap() - 0.45).abs() < 1e-9);
        assert_eq!(
            l.itl_p90, None,
            "requests, none streamed past the first token"
        );
        assert_eq!(l.prefill_p90, None, "no prefill leg");
        // Nothing answered since: idle, under any target.
        let idle = vec![("a".to_owned(), g(10.0, 10.0))];
        let zero = Some(0.0);
        assert_eq!(
            interval_latency(&idle, &before),
            Latency {
                ttft_p90: zero,
                itl_p90: zero,
                prefill_p90: zero
            }
        );
        // No baseline yet: no signal.
        assert_eq!(interval_latency(&idle, &HashMap::new()), Latency::default());
    }

    #[test]
    fn prefill_legs_are_differenced_per_worker() {
        let legs = |workers: &[(&str, f64, f64)]| GatewayLatency {
            requests: vec![(f64::INFINITY, 100.0)],
            prefill: workers
                .iter()
                .map(|&(w, fast, all)| {
                    (
                        w.to_owned(),
                        vec![(0.1, fast), (1.0, all), (f64::INFINITY, all)],
                    )
                })
                .collect(),
            ..GatewayLatency::default()
        };
        let mut before = HashMap::from([(
            "a".to_owned(),
            legs(&[("p-0", 10.0, 10.0), ("p-1", 50.0, 50.0)]),
        )]);
        before.get_mut("a").unwrap().requests = vec![(f64::INFINITY, 60.0)];
        // p-1 left (its series with it): not a restart. p-0 took 10 more, all slow;
        // p-2 is new and counts whole: 10 fast. 20 legs, rank 18 in (0.1, 1.0].
        let now = vec![(
            "a".to_owned(),
            legs(&[("p-0", 10.0, 20.0), ("p-2", 10.0, 10.0)]),
        )];
        let p90 = interval_latency(&now, &before).prefill_p90.unwrap();
        assert!((p90 - (0.1 + 0.9 * 0.8)).abs() < 1e-9, "{p90}");
    }

    #[test]
    fn requests_held_in_the_gateways_count_as_the_roles_waiting() {
        let held = |role: &str, n: f64| GatewayLatency {
            queued: [(role.to_owned(), n)].into_iter().collect(),
            ..GatewayLatency::default()
        };
        let gateways = [
            held("decode", 3.0),
            held("decode", 2.0),
            held("prefill", 7.0),
        ];
        let mut s = role_signals(Role::Decode, 1, &[(Role::Decode, None)], &[], None);
        assert_eq!(s.waiting, None);
        add_gateway_queue(&mut s, gateways.iter());
        assert_eq!(s.waiting, Some(5.0));
        let mut mixed = role_signals(Role::Mixed, 1, &[], &[], None);
        add_gateway_queue(&mut mixed, gateways.iter());
        assert_eq!(mixed.waiting, None, "no mixed requests held");
    }

    #[test]
    fn role_signals_sum_the_queue_and_average_kv_usage() {
        let load = |w, kv| {
            Some(signals::EngineLoad {
                waiting: Some(w),
                running: Some(1.0),
                kv_usage: Some(kv),
            })
        };
        let engines = vec![
            (Role::Decode, load(2.0, 0.2)),
            (Role::Decode, load(3.0, 0.4)),
            (Role::Decode, None),
            (Role::Prefill, load(9.0, 0.9)),
        ];
        let status = vec![crate::api::RoleStatus {
            role: "decode".into(),
            replicas: 3,
            ready_replicas: 2,
        }];
        let s = role_signals(Role::Decode, 3, &engines, &status, Some(2.0));
        assert_eq!(s.waiting, Some(5.0));
        assert_eq!(s.running, Some(2.0));
        assert_eq!(s.seats, Some(2.0));
        assert!((s.kv_usage.unwrap() - 0.3).abs() < 1e-9);
        assert_eq!(s.ready, 2);
        assert!(!s.complete, "one decode engine did not answer");
        assert!(role_signals(Role::Prefill, 1, &engines, &status, None).complete);
        assert!(!role_signals(Role::Mixed, 1, &engines, &status, None).complete);
        // A status about another count (not caught up): not ready yet.
        assert_eq!(
            role_signals(Role::Decode, 4, &engines, &status, None).ready,
            0
        );
    }

    #[test]
    fn seats_are_what_a_worker_ran_while_its_queue_was_not_empty() {
        let load = |waiting, running| {
            Some(signals::EngineLoad {
                waiting: Some(waiting),
                running: Some(running),
                kv_usage: None,
            })
        };
        let mut seats = HashMap::new();
        // Running 3 without a queue says nothing of the limit.
        learn_seats(&mut seats, &[(Role::Mixed, load(0.0, 3.0))], &[]);
        assert!(seats.is_empty());
        learn_seats(
            &mut seats,
            &[(Role::Mixed, load(2.0, 2.0)), (Role::Decode, None)],
            &[],
        );
        learn_seats(&mut seats, &[(Role::Mixed, load(1.0, 4.0))], &[]);
        learn_seats(&mut seats, &[(Role::Mixed, load(5.0, 1.0))], &[]);
        assert_eq!(seats, HashMap::from([(Role::Mixed, 4.0)]));
        // No queue, but over a latency target: full too (a prefill worker).
        learn_seats(&mut seats, &[(Role::Prefill, load(0.0, 2.0))], &[]);
        assert!(!seats.contains_key(&Role::Prefill));
        learn_seats(
            &mut seats,
            &[(Role::Prefill, load(0.0, 2.0))],
            &[Role::Prefill],
        );
        assert_eq!(seats.get(&Role::Prefill), Some(&2.0));
    }
}
