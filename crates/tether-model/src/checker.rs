//! A small explicit-state model checker: breadth-first over every reachable state (so a
//! counterexample is a shortest trace), invariants checked in each state, and liveness as
//! "from every reachable state the goal is still reachable, without another fault" once the graph is
//! complete.

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;

/// A finite transition system.
pub trait Model {
    /// A state; equal states are visited once.
    type State: Clone + Eq + Hash + Debug;
    /// What moves the system from one state to the next.
    type Action: Clone + Debug;

    /// The initial state.
    fn init(&self) -> Self::State;
    /// The actions enabled in `state`.
    fn actions(&self, state: &Self::State) -> Vec<Self::Action>;
    /// The state `action` leads to.
    fn next(&self, state: &Self::State, action: &Self::Action) -> Self::State;
    /// The properties every reachable state must have: a name and a check that says why not.
    fn invariants(&self) -> Vec<Invariant<Self::State>>;
    /// What must stay reachable from every state (liveness: nothing can get stuck short of it).
    fn goal(&self, state: &Self::State) -> bool;

    /// Whether `action` is a fault: liveness must hold without one (a request that ends only if
    /// its server happens to restart is stuck).
    fn is_fault(&self, _action: &Self::Action) -> bool {
        false
    }
}

/// A property of single states.
pub struct Invariant<S> {
    /// Its name, as reports print it.
    pub name: &'static str,
    /// `Err(why)` if the state breaks the property.
    pub check: fn(&S) -> Result<(), String>,
}

/// A property that fails, and the shortest way there.
#[derive(Debug, Clone)]
pub struct Counterexample<A, S> {
    /// The property's name (`liveness` for the goal).
    pub property: &'static str,
    /// Why the last state breaks it.
    pub why: String,
    /// The initial state, then each action and the state it led to.
    pub trace: Vec<(Option<A>, S)>,
}

impl<A: Debug, S: Debug> std::fmt::Display for Counterexample<A, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "property {} fails: {}", self.property, self.why)?;
        for (step, (action, state)) in self.trace.iter().enumerate() {
            match action {
                None => writeln!(f, "  {step:>2}. init      {state:?}")?,
                Some(action) => writeln!(f, "  {step:>2}. {action:?}\n      -> {state:?}")?,
            }
        }
        Ok(())
    }
}

/// What a check found.
#[derive(Debug, Clone)]
pub struct Report<A, S> {
    /// Distinct states visited.
    pub states: usize,
    /// Transitions followed.
    pub transitions: usize,
    /// The first property found broken, if any.
    pub counterexample: Option<Counterexample<A, S>>,
}

/// The state space grew past the bound given to [`check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("more than {0} states: the model's bounds are too loose")]
pub struct TooManyStates(pub usize);

/// Visits every state reachable from the model's initial state (at most `max_states`).
pub fn check<M: Model>(model: &M, max_states: usize) -> Result<Report<M::Action, M::State>, TooManyStates> {
    let invariants = model.invariants();
    let mut index: HashMap<M::State, usize> = HashMap::new();
    let mut states: Vec<M::State> = Vec::new();
    let mut parent: Vec<Option<(usize, M::Action)>> = Vec::new();
    let mut successors: Vec<Vec<usize>> = Vec::new();
    let mut queue = VecDeque::new();
    let mut transitions = 0;

    let init = model.init();
    index.insert(init.clone(), 0);
    states.push(init);
    parent.push(None);
    successors.push(Vec::new());
    queue.push_back(0);

    while let Some(at) = queue.pop_front() {
        let state = states[at].clone();
        for invariant in &invariants {
            if let Err(why) = (invariant.check)(&state) {
                let counterexample =
                    Counterexample { property: invariant.name, why, trace: trace(&states, &parent, at) };
                return Ok(Report { states: states.len(), transitions, counterexample: Some(counterexample) });
            }
        }
        for action in model.actions(&state) {
            let next = model.next(&state, &action);
            let fault = model.is_fault(&action);
            transitions += 1;
            let target = match index.get(&next) {
                Some(&known) => known,
                None => {
                    if states.len() >= max_states {
                        return Err(TooManyStates(max_states));
                    }
                    let id = states.len();
                    index.insert(next.clone(), id);
                    states.push(next);
                    parent.push(Some((at, action)));
                    successors.push(Vec::new());
                    queue.push_back(id);
                    id
                }
            };
            if !fault {
                successors[at].push(target);
            }
        }
    }

    // Liveness: walk back from every goal state; a state never reached cannot reach the goal.
    let mut predecessors: Vec<Vec<usize>> = vec![Vec::new(); states.len()];
    for (from, targets) in successors.iter().enumerate() {
        for &to in targets {
            predecessors[to].push(from);
        }
    }
    let mut can_finish = vec![false; states.len()];
    let mut back: VecDeque<usize> = (0..states.len()).filter(|&i| model.goal(&states[i])).collect();
    for &goal in &back {
        can_finish[goal] = true;
    }
    while let Some(at) = back.pop_front() {
        for &from in &predecessors[at] {
            if !can_finish[from] {
                can_finish[from] = true;
                back.push_back(from);
            }
        }
    }
    // BFS ids grow with distance, so the first stuck state has the shortest trace.
    let counterexample = can_finish.iter().position(|ok| !ok).map(|stuck| Counterexample {
        property: "liveness",
        why: "from this state the goal can no longer be reached".into(),
        trace: trace(&states, &parent, stuck),
    });
    Ok(Report { states: states.len(), transitions, counterexample })
}

fn trace<A: Clone, S: Clone>(states: &[S], parent: &[Option<(usize, A)>], mut at: usize) -> Vec<(Option<A>, S)> {
    let mut steps = Vec::new();
    loop {
        match &parent[at] {
            Some((from, action)) => {
                steps.push((Some(action.clone()), states[at].clone()));
                at = *from;
            }
            None => {
                steps.push((None, states[at].clone()));
                break;
            }
        }
    }
    steps.reverse();
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter that may step by one or two up to a limit; `broken` lets it jump past.
    struct Counter {
        limit: u8,
        broken: bool,
    }

    impl Model for Counter {
        type State = u8;
        type Action = u8;
        fn init(&self) -> u8 {
            0
        }
        fn actions(&self, state: &u8) -> Vec<u8> {
            let mut steps: Vec<u8> = [1, 2].into_iter().filter(|s| state + s <= self.limit).collect();
            if self.broken && *state == 1 {
                steps.push(self.limit);
            }
            steps
        }
        fn next(&self, state: &u8, action: &u8) -> u8 {
            state + action
        }
        fn invariants(&self) -> Vec<Invariant<u8>> {
            vec![Invariant {
                name: "at_most_limit",
                check: |s| if *s <= 10 { Ok(()) } else { Err(format!("{s} > 10")) },
            }]
        }
        fn goal(&self, state: &u8) -> bool {
            *state == self.limit
        }
    }

    #[test]
    fn finds_every_state_and_the_shortest_counterexample() {
        let report = check(&Counter { limit: 10, broken: false }, 100).expect("bounded");
        assert_eq!(report.states, 11);
        assert!(report.counterexample.is_none());
        let report = check(&Counter { limit: 10, broken: true }, 100).expect("bounded");
        let counterexample = report.counterexample.expect("found");
        assert_eq!(counterexample.property, "at_most_limit");
        let actions: Vec<_> = counterexample.trace.iter().filter_map(|(a, _)| *a).collect();
        assert_eq!(actions, [1, 10], "the shortest trace");
        assert!(matches!(check(&Counter { limit: 10, broken: false }, 5), Err(TooManyStates(5))));
    }

    #[test]
    fn a_state_that_cannot_reach_the_goal_breaks_liveness() {
        // Steps by one stop at 3; the goal is 5: no state can reach it.
        struct Stuck;
        impl Model for Stuck {
            type State = u8;
            type Action = u8;
            fn init(&self) -> u8 {
                0
            }
            fn actions(&self, state: &u8) -> Vec<u8> {
                if *state < 3 { vec![1] } else { vec![] }
            }
            fn next(&self, state: &u8, action: &u8) -> u8 {
                state + action
            }
            fn invariants(&self) -> Vec<Invariant<u8>> {
                Vec::new()
            }
            fn goal(&self, state: &u8) -> bool {
                *state == 5
            }
        }
        let counterexample = check(&Stuck, 100).expect("bounded").counterexample.expect("stuck");
        assert_eq!(counterexample.property, "liveness");
        assert_eq!(counterexample.trace.len(), 1, "already the initial state is stuck");
    }

    #[test]
    fn a_goal_reachable_only_through_a_fault_breaks_liveness() {
        // From 0, a step of 1 is a fault; a step of 2 is not. The goal 1 is reached only by the
        // fault, so 2, and 0 itself, are stuck.
        struct OnlyByFault;
        impl Model for OnlyByFault {
            type State = u8;
            type Action = u8;
            fn init(&self) -> u8 {
                0
            }
            fn actions(&self, state: &u8) -> Vec<u8> {
                if *state == 0 { vec![1, 2] } else { vec![] }
            }
            fn next(&self, state: &u8, action: &u8) -> u8 {
                state + action
            }
            fn invariants(&self) -> Vec<Invariant<u8>> {
                Vec::new()
            }
            fn goal(&self, state: &u8) -> bool {
                *state == 1
            }
            fn is_fault(&self, action: &u8) -> bool {
                *action == 1
            }
        }
        let counterexample = check(&OnlyByFault, 100).expect("bounded").counterexample.expect("stuck");
        assert_eq!(counterexample.property, "liveness");
    }
}
