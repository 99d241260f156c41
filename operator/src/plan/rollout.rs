//! Rolling a role's workers onto a new revision without emptying it (pure).
//!
//! A StatefulSet has no surge, so the operator runs each role's StatefulSet with the
//! `OnDelete` strategy (it never replaces a pod by itself) and moves a window of
//! ordinals over it: `spec.ordinals.start` and `spec.replicas`. Raising `replicas`
//! starts new pods at the top of the window, on the current template; raising `start`
//! removes the pod at the bottom, which drains through its preStop hook like any
//! deleted pod. Old pods sit at the bottom (they were there first), so a rollout is:
//!
//! 1. open the window by up to `maxSurge` above the role's count;
//! 2. on every reconcile, remove pods from the bottom while the role keeps at least
//!    `count - maxUnavailable` ready pods (a pod that is not ready is removed freely);
//! 3. with prefill and decode, the last ready old pod of a role goes only together with
//!    the other roles' last ones, and only once the new revision has a ready pod in
//!    every role: until then the old revision keeps a complete prefill/decode pair.
//!
//! The pod names (ordinals) of a role therefore grow over rollouts. A new pod that
//! cannot be scheduled holds the rollout (nothing old is removed while the floor needs
//! it) and is reported with the scheduler's reason.

/// A role's rollout limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutLimits {
    /// Pods above the role's count while it rolls.
    pub max_surge: u32,
    /// Pods of the role that may be missing while it rolls.
    pub max_unavailable: u32,
}

impl Default for RolloutLimits {
    fn default() -> Self {
        Self {
            max_surge: 1,
            max_unavailable: 0,
        }
    }
}

/// A role's StatefulSet as it stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveWorkers {
    /// `spec.ordinals.start`.
    pub start: i32,
    /// `spec.replicas`.
    pub replicas: i32,
    /// Its pods.
    pub pods: Vec<LivePod>,
}

/// One pod of a role.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LivePod {
    /// Its ordinal.
    pub ordinal: i32,
    /// Its `infera.amd.com/engine-revision` label (none on a pod of release 0.1.0).
    pub revision: Option<String>,
    /// Its `Ready` condition is true.
    pub ready: bool,
    /// It is being deleted.
    pub terminating: bool,
    /// The scheduler's message while it cannot be placed.
    pub unschedulable: Option<String>,
}

/// One role as the rollout sees it.
#[derive(Debug, Clone, Copy)]
pub struct RoleInput<'a> {
    /// Workers the spec wants (0 while the model downloads).
    pub desired: i32,
    /// Its limits.
    pub limits: RolloutLimits,
    /// Its StatefulSet, when it exists.
    pub live: Option<&'a LiveWorkers>,
    /// The revision its pods must carry; `None` for a role kept on release 0.1.0 (its
    /// pods carry none, and keep their template).
    pub revision: Option<&'a str>,
}

/// The ordinals a role's StatefulSet runs: `[start, start + replicas)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// `spec.ordinals.start`.
    pub start: i32,
    /// `spec.replicas`.
    pub replicas: i32,
}

/// Where a role's rollout stands, before this decision's moves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleProgress {
    /// Workers the role has when done.
    pub desired: i32,
    /// Pods on the current template (ready or starting).
    pub updated: i32,
    /// Pods on an older one.
    pub old: i32,
    /// Pods ready, old and new.
    pub ready: i32,
    /// Why a new pod cannot start.
    pub blocked: Option<String>,
    /// Old pods remain.
    pub rolling: bool,
}

/// A slot of the window: the pod at one ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    /// On an old template.
    old: bool,
    /// Ready.
    ready: bool,
}

/// A role's window, slot by slot from the bottom.
struct Classified {
    start: i32,
    slots: Vec<Slot>,
    blocked: Option<String>,
}

impl Classified {
    fn old(&self) -> i32 {
        count(&self.slots, |s| s.old)
    }

    fn ready(&self) -> i32 {
        count(&self.slots, |s| s.ready)
    }

    fn updated_ready(&self) -> i32 {
        count(&self.slots, |s| s.ready && !s.old)
    }
}

fn count(slots: &[Slot], f: impl Fn(&Slot) -> bool) -> i32 {
    i32::try_from(slots.iter().filter(|s| f(s)).count()).unwrap_or(i32::MAX)
}

/// The window's slots from the bottom. The revision covers every role's template, so
/// a pod is on the current template exactly when it carries the current revision.
fn classify(input: &RoleInput<'_>, live: &LiveWorkers) -> Classified {
    let mut blocked = None;
    let slots = (live.start..live.start.saturating_add(live.replicas))
        .map(|ordinal| {
            let pod = live
                .pods
                .iter()
                .find(|p| p.ordinal == ordinal && !p.terminating);
            match pod {
                // Not there yet (or being replaced): the controller creates it from the
                // current template.
                None => Slot {
                    old: false,
                    ready: false,
                },
                Some(pod) => {
                    let old = input
                        .revision
                        .is_some_and(|r| pod.revision.as_deref() != Some(r));
                    if !old && !pod.ready && blocked.is_none() {
                        blocked = pod.unschedulable.clone();
                    }
                    Slot {
                        old,
                        ready: pod.ready,
                    }
                }
            }
        })
        .collect();
    Classified {
        start: live.start,
        slots,
        blocked,
    }
}

/// What one role does now.
struct Step {
    /// Slots removed from the bottom.
    retired: usize,
    /// Ready pods left.
    ready: i32,
    /// The bottom slot is the role's last ready old pod, which the floor would let go:
    /// it waits for the other roles' last ones.
    holding_last: bool,
}

/// Removes slots from the bottom while the floor allows; stops at the last ready old
/// pod when `hold_last`.
fn retire(c: &Classified, desired: i32, limits: RolloutLimits, hold_last: bool) -> Step {
    let floor = (desired - i32::try_from(limits.max_unavailable).unwrap_or(i32::MAX)).max(0);
    let mut step = Step {
        retired: 0,
        ready: c.ready(),
        holding_last: false,
    };
    let mut old_ready = count(&c.slots, |s| s.old && s.ready);
    let mut old = c.old();
    for slot in &c.slots {
        if old == 0 {
            break;
        }
        let after = step.ready - i32::from(slot.ready);
        if slot.ready && after < floor {
            break;
        }
        if hold_last && slot.old && slot.ready && old_ready == 1 {
            step.holding_last = true;
            break;
        }
        step.retired += 1;
        step.ready = after;
        old -= i32::from(slot.old);
        old_ready -= i32::from(slot.old && slot.ready);
    }
    step
}

/// Each role's window and progress, in the order of `roles`. With more than one role
/// (prefill and decode), their last ready old pods leave together, once the new
/// revision has a ready pod in every role.
pub fn plan_rollout(roles: &[RoleInput<'_>]) -> Vec<(Window, RoleProgress)> {
    let classified: Vec<Option<Classified>> = roles
        .iter()
        .map(|r| r.live.map(|live| classify(r, live)))
        .collect();
    let topology = roles.len() > 1;
    let mut steps: Vec<Option<Step>> = roles
        .iter()
        .zip(&classified)
        .map(|(r, c)| c.as_ref().map(|c| retire(c, r.desired, r.limits, topology)))
        .collect();
    // The last old pods of every role, together: when each role still rolling holds
    // exactly its last one and the new revision is complete.
    let new_complete = roles
        .iter()
        .zip(&classified)
        .all(|(r, c)| r.desired == 0 || c.as_ref().is_some_and(|c| c.updated_ready() > 0));
    let rolling: Vec<bool> = classified
        .iter()
        .zip(&steps)
        .map(|(c, s)| match (c, s) {
            (Some(c), Some(s)) => remaining_old(c, s.retired) > 0,
            _ => false,
        })
        .collect();
    let all_holding = steps
        .iter()
        .zip(&rolling)
        .all(|(s, rolling)| !rolling || s.as_ref().is_some_and(|s| s.holding_last));
    if topology && new_complete && all_holding {
        for ((r, c), step) in roles.iter().zip(&classified).zip(&mut steps) {
            if let (Some(c), Some(s)) = (c, step.as_mut())
                && s.holding_last
            {
                *s = retire(c, r.desired, r.limits, false);
            }
        }
    }
    roles
        .iter()
        .zip(classified.iter().zip(&steps))
        .map(|(r, (c, step))| decide_role(r, c.as_ref(), step.as_ref()))
        .collect()
}

fn remaining_old(c: &Classified, retired: usize) -> i32 {
    count(&c.slots[retired.min(c.slots.len())..], |s| s.old)
}

fn decide_role(
    input: &RoleInput<'_>,
    classified: Option<&Classified>,
    step: Option<&Step>,
) -> (Window, RoleProgress) {
    let steady = |start: i32| Window {
        start,
        replicas: input.desired,
    };
    let (Some(c), Some(step)) = (classified, step) else {
        return (steady(0), progress_of(input, None));
    };
    let progress = progress_of(input, Some(c));
    if c.old() == 0 || input.desired == 0 {
        return (steady(c.start), progress);
    }
    let old = remaining_old(c, step.retired);
    let surge = i32::try_from(input.limits.max_surge).unwrap_or(i32::MAX);
    let retired = i32::try_from(step.retired).unwrap_or(i32::MAX);
    let window = Window {
        start: c.start + retired,
        replicas: (input.desired.saturating_add(surge)).min(old + input.desired),
    };
    (window, progress)
}

fn progress_of(input: &RoleInput<'_>, c: Option<&Classified>) -> RoleProgress {
    match c {
        None => RoleProgress {
            desired: input.desired,
            ..RoleProgress::default()
        },
        Some(c) => {
            let old = c.old();
            RoleProgress {
                desired: input.desired,
                updated: count(&c.slots, |s| !s.old),
                old,
                ready: c.ready(),
                blocked: (old > 0).then(|| c.blocked.clone()).flatten(),
                rolling: old > 0,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "old";
    const NEW: &str = "new";

    /// A StatefulSet with pods `(ordinal, revision, ready)`.
    fn live(start: i32, replicas: i32, pods: &[(i32, &str, bool)]) -> LiveWorkers {
        LiveWorkers {
            start,
            replicas,
            pods: pods
                .iter()
                .map(|&(ordinal, revision, ready)| LivePod {
                    ordinal,
                    revision: Some(revision.into()),
                    ready,
                    terminating: false,
                    unschedulable: None,
                })
                .collect(),
        }
    }

    /// A role whose pods must carry `NEW`.
    fn input(desired: i32, live: &LiveWorkers) -> RoleInput<'_> {
        RoleInput {
            desired,
            limits: RolloutLimits::default(),
            live: Some(live),
            revision: Some(NEW),
        }
    }

    fn window(start: i32, replicas: i32) -> Window {
        Window { start, replicas }
    }

    #[test]
    fn a_new_role_and_a_steady_one_run_their_count() {
        let fresh = RoleInput {
            desired: 3,
            limits: RolloutLimits::default(),
            live: None,
            revision: Some(NEW),
        };
        assert_eq!(plan_rollout(&[fresh])[0].0, window(0, 3));
        // Steady after earlier rollouts: the window stays where it is; a scale moves
        // its top.
        let set = live(4, 2, &[(4, NEW, true), (5, NEW, true)]);
        let (w, p) = plan_rollout(&[input(3, &set)]).remove(0);
        assert_eq!(w, window(4, 3));
        assert!(!p.rolling);
    }

    #[test]
    fn a_template_change_opens_the_window_by_the_surge_and_removes_nothing() {
        let set = live(0, 2, &[(0, OLD, true), (1, OLD, true)]);
        let (w, p) = plan_rollout(&[input(2, &set)]).remove(0);
        assert_eq!(w, window(0, 3));
        assert_eq!((p.old, p.updated, p.ready, p.rolling), (2, 0, 2, true));
    }

    #[test]
    fn an_old_pod_leaves_only_once_a_new_one_is_ready() {
        // The surge pod starts: nothing leaves.
        let set = live(0, 3, &[(0, OLD, true), (1, OLD, true), (2, NEW, false)]);
        assert_eq!(plan_rollout(&[input(2, &set)])[0].0, window(0, 3));
        // It is ready: the bottom pod leaves, the next new one starts.
        let set = live(0, 3, &[(0, OLD, true), (1, OLD, true), (2, NEW, true)]);
        assert_eq!(plan_rollout(&[input(2, &set)])[0].0, window(1, 3));
        // The last old pod leaves once the second new one is ready; then steady.
        let set = live(1, 3, &[(1, OLD, true), (2, NEW, true), (3, NEW, true)]);
        assert_eq!(plan_rollout(&[input(2, &set)])[0].0, window(2, 2));
        let set = live(2, 2, &[(2, NEW, true), (3, NEW, true)]);
        assert!(!plan_rollout(&[input(2, &set)])[0].1.rolling);
    }

    #[test]
    fn without_surge_max_unavailable_removes_before_it_adds() {
        let set = live(0, 2, &[(0, OLD, true), (1, OLD, true)]);
        let role = RoleInput {
            limits: RolloutLimits {
                max_surge: 0,
                max_unavailable: 1,
            },
            ..input(2, &set)
        };
        // One old pod goes, its replacement starts at the top.
        assert_eq!(plan_rollout(&[role])[0].0, window(1, 2));
        // Not below the floor while the replacement starts.
        let set = live(1, 2, &[(1, OLD, true), (2, NEW, false)]);
        let role = RoleInput {
            live: Some(&set),
            ..role
        };
        assert_eq!(plan_rollout(&[role])[0].0, window(1, 2));
    }

    #[test]
    fn a_broken_old_pod_leaves_at_once_and_an_unschedulable_new_one_blocks() {
        // An old pod that is not ready costs nothing to remove.
        let set = live(0, 3, &[(0, OLD, false), (1, OLD, true), (2, NEW, false)]);
        assert_eq!(plan_rollout(&[input(2, &set)])[0].0, window(1, 3));
        let mut set = live(0, 3, &[(0, OLD, true), (1, OLD, true), (2, NEW, false)]);
        set.pods[2].unschedulable =
            Some("0/1 nodes are available: 1 Insufficient amd.com/gpu.".into());
        let (w, p) = plan_rollout(&[input(2, &set)]).remove(0);
        assert_eq!(w, window(0, 3), "nothing old leaves");
        assert_eq!(
            p.blocked.as_deref(),
            Some("0/1 nodes are available: 1 Insufficient amd.com/gpu.")
        );
    }

    #[test]
    fn a_role_kept_on_0_1_0_never_rolls_and_zero_removes_everything() {
        // Its pods carry no revision and keep their template.
        let set = live(0, 2, &[(0, "", true), (1, "", true)]);
        let kept = RoleInput {
            revision: None,
            ..input(3, &set)
        };
        let (w, p) = plan_rollout(&[kept]).remove(0);
        assert_eq!((w, p.rolling), (window(0, 3), false));
        // Scaled to zero mid-rollout: everything goes.
        let set = live(0, 3, &[(0, OLD, true), (1, OLD, true), (2, NEW, true)]);
        assert_eq!(plan_rollout(&[input(0, &set)])[0].0, window(0, 0));
    }

    #[test]
    fn prefill_and_decode_keep_one_complete_pair_of_the_old_revision_until_the_new_one_has_theirs()
    {
        // 2P1D after the surge pods came up: a prefill leaves, but the decode's only old
        // pod waits, since the prefill role still has its last old one.
        let prefill = live(0, 3, &[(0, OLD, true), (1, OLD, true), (2, NEW, true)]);
        let decode = live(0, 2, &[(0, OLD, true), (1, NEW, true)]);
        let plan = plan_rollout(&[input(2, &prefill), input(1, &decode)]);
        assert_eq!(plan[0].0, window(1, 3));
        assert_eq!(plan[1].0, window(0, 2));
        // The prefill's second new pod is ready: both last old pods leave together.
        let prefill = live(1, 3, &[(1, OLD, true), (2, NEW, true), (3, NEW, true)]);
        let plan = plan_rollout(&[input(2, &prefill), input(1, &decode)]);
        assert_eq!(plan[0].0, window(2, 2));
        assert_eq!(plan[1].0, window(1, 1));
    }

    #[test]
    fn the_old_pair_stays_while_the_new_revision_lacks_a_role() {
        // 1P1D: the decode's surge pod is ready, the prefill's is not: nothing leaves.
        let prefill = live(0, 2, &[(0, OLD, true), (1, NEW, false)]);
        let decode = live(0, 2, &[(0, OLD, true), (1, NEW, true)]);
        let plan = plan_rollout(&[input(1, &prefill), input(1, &decode)]);
        assert_eq!((plan[0].0, plan[1].0), (window(0, 2), window(0, 2)));
        // Both ready: both old pods leave.
        let prefill = live(0, 2, &[(0, OLD, true), (1, NEW, true)]);
        let plan = plan_rollout(&[input(1, &prefill), input(1, &decode)]);
        assert_eq!((plan[0].0, plan[1].0), (window(1, 1), window(1, 1)));
        // A role already done does not hold the other.
        let decode = live(1, 1, &[(1, NEW, true)]);
        let plan = plan_rollout(&[input(1, &prefill), input(1, &decode)]);
        assert_eq!((plan[0].0, plan[1].0), (window(1, 1), window(1, 1)));
    }
}
