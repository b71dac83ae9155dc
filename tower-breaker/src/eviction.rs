//! Which breaker a new key replaces when the registry is full, in the order
//! the [crate docs](crate#keyed-breakers) give.
//!
//! Two queues, *closed* and *open*, are intrusive doubly linked lists over a
//! slab (O(1) moves). A call for a known key does not take their lock (that
//! would cost every call): it only stamps its breaker with the registry's
//! coarse clock, bumped once per new key. A victim is sought at the closed
//! queue's head: one stamped since it joined goes to the tail again with a
//! fresh join time (the second chance of CLOCK page replacement, which
//! approximates LRU); one open or half-open now moves to the open queue; one
//! an operator forced is *parked*, in no queue, until a reset; else it is the
//! victim.
//!
//! Among open breakers the order is exact: one that is not closed is stamped
//! from one sequence on every use and when it opens
//! ([`EvictionNotices::stamp`]), off the closed fast path. Only when the
//! closed queue is empty is the open queue scanned whole for the lowest
//! stamp; the breaker put in the victim's place is closed and the next
//! victim, so another scan needs another breaker to open first.
//!
//! A breaker that closes again posts a notice
//! ([`EvictionNotices::post_closed`]) and is moved back before the next
//! victim is chosen. Every step of an examination but the last consumes a
//! use, state change or force since the breaker's previous step, so the work
//! per new key is O(1) amortised whatever `max_breakers` is; after `2 × len`
//! steps breakers are no longer moved or given a second chance, so racing
//! state changes cannot make it loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::machine::Breaker;
use crate::state::State;

const NIL: usize = usize::MAX;

/// The registry's eviction order; see the module docs. Lives under the
/// registry's insert lock.
pub(crate) struct EvictionQueues {
    nodes: Vec<Node>,
    /// Slab slots free for reuse.
    free: Vec<usize>,
    closed: List,
    open: List,
}

struct Node {
    /// `None` while the slot is free.
    breaker: Option<Arc<Breaker>>,
    prev: usize,
    next: usize,
    queue: Queue,
    /// The clock when the breaker joined its queue: a later stamp means it
    /// was used since.
    joined: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Queue {
    Closed,
    Open,
    /// Forced by an operator: in no queue, never a victim.
    Parked,
    Free,
}

#[derive(Clone, Copy)]
struct List {
    head: usize,
    tail: usize,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
    };
}

/// What a keyed breaker tells its registry's eviction order: that it closed
/// again, and the order of its uses while not closed.
#[derive(Default)]
pub(crate) struct EvictionNotices {
    /// The keys of breakers that closed again (probes succeeded, or an
    /// operator reset them) since the eviction queues last looked. A breaker
    /// posts at most one notice until it is read, so there are never more
    /// than `max_breakers` of them.
    closed: Mutex<Vec<Arc<str>>>,
    /// The last stamp handed out by [`stamp`](Self::stamp); stamps start
    /// at 1, so 0 is "never stamped".
    uses: AtomicU64,
}

impl EvictionNotices {
    /// Called on the state change, by the call (or operator) that made it.
    pub(crate) fn post_closed(&self, key: &Arc<str>) {
        self.closed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(key));
    }

    pub(crate) fn take_closed(&self) -> Vec<Arc<str>> {
        std::mem::take(&mut *self.closed.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Records a use of a breaker that is not closed (a call looked it up,
    /// or a call's failure opened it) in its `open_used`: one total order
    /// over every such use in the registry.
    pub(crate) fn stamp(&self, open_used: &AtomicU64) {
        let last = open_used.load(Ordering::Relaxed);
        if last != 0 && last == self.uses.load(Ordering::Relaxed) {
            // Already the most recent use: the order stays as it is. Under
            // a flood of refusals for one key this writes nothing shared.
            return;
        }
        let now = self.uses.fetch_add(1, Ordering::Relaxed) + 1;
        open_used.fetch_max(now, Ordering::Relaxed);
    }
}

/// The breaker chosen to make room.
pub(crate) enum Victim {
    /// The least recently used closed breaker.
    Closed(Arc<Breaker>),
    /// No breaker is closed: the least recently used open (or half-open) one.
    Open(Arc<Breaker>),
    /// Every breaker is forced by an operator.
    None,
}

impl EvictionQueues {
    pub(crate) fn new() -> Self {
        EvictionQueues {
            nodes: Vec::new(),
            free: Vec::new(),
            closed: List::EMPTY,
            open: List::EMPTY,
        }
    }

    /// Breakers held (queued or parked): every slot not free.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Adds a new breaker at the closed queue's tail, noting its node in
    /// the breaker.
    pub(crate) fn insert(&mut self, breaker: Arc<Breaker>, now: u64) {
        let id = self.free.pop().unwrap_or(self.nodes.len());
        breaker.node.store(id, Ordering::Relaxed);
        let node = Node {
            breaker: Some(breaker),
            prev: NIL,
            next: NIL,
            queue: Queue::Free,
            joined: now,
        };
        match self.nodes.get_mut(id) {
            Some(slot) => *slot = node,
            None => self.nodes.push(node),
        }
        self.push(id, Queue::Closed, now);
    }

    /// Puts a breaker an operator no longer forces back in line, as if just
    /// used. A no-op unless it is parked.
    pub(crate) fn unpark(&mut self, breaker: &Arc<Breaker>, now: u64) {
        if let Some((id, Queue::Parked, _)) = self.holding(breaker) {
            self.push(id, Queue::Closed, now);
        }
    }

    /// Moves a breaker that posted a [`EvictionNotices::post_closed`] notice from the open
    /// queue back to the closed one, keeping its join time. A no-op unless
    /// it is queued as open and closed now.
    pub(crate) fn closed_again(&mut self, breaker: &Arc<Breaker>) {
        if let Some((id, Queue::Open, joined)) = self.holding(breaker) {
            if breaker.state() == State::Closed {
                self.unlink(id);
                self.push(id, Queue::Closed, joined);
            }
        }
    }

    /// The node, queue and join time of `breaker`, if its node still holds
    /// it (a node is reused once its breaker is evicted).
    fn holding(&self, breaker: &Arc<Breaker>) -> Option<(usize, Queue, u64)> {
        let id = breaker.node.load(Ordering::Relaxed);
        let entry = self.nodes.get(id)?;
        let held = entry.breaker.as_ref()?;
        Arc::ptr_eq(held, breaker).then_some((id, entry.queue, entry.joined))
    }

    /// Chooses and removes a victim; see the module docs.
    pub(crate) fn evict(&mut self, now: u64) -> Victim {
        // Past this many steps, stop moving breakers between queues and
        // giving second chances: each step then parks or evicts.
        let mut patience = self.len().saturating_mul(2).saturating_add(2);
        loop {
            let patient = patience > 0;
            patience = patience.saturating_sub(1);
            let id = match self.closed.head {
                NIL => return self.evict_open(),
                id => id,
            };
            let breaker = self.queued(id);
            let state = breaker.state();
            let joined = self.nodes[id].joined;
            if state.is_forced() {
                self.park(id);
                continue;
            }
            if patient {
                if state.is_open() {
                    // Keeps its join time: moving is not a use.
                    self.unlink(id);
                    self.push(id, Queue::Open, joined);
                    continue;
                }
                if breaker.last_used.load(Ordering::Relaxed) > joined {
                    self.unlink(id);
                    self.push(id, Queue::Closed, now);
                    continue;
                }
            }
            let breaker = self.remove(id);
            return if state.is_open() {
                Victim::Open(breaker)
            } else {
                Victim::Closed(breaker)
            };
        }
    }

    /// No breaker is queued as closed: the open breaker with the lowest
    /// [`EvictionNotices::stamp`], the least recently used. Forced breakers
    /// met on the way are parked; one that closed again since its notice was
    /// read is a closed victim, the only one there is.
    fn evict_open(&mut self) -> Victim {
        let mut oldest: Option<(u64, usize)> = None;
        let mut id = self.open.head;
        while id != NIL {
            let next = self.nodes[id].next;
            let breaker = self.queued(id);
            let state = breaker.state();
            if state.is_forced() {
                self.park(id);
            } else if !state.is_open() {
                return Victim::Closed(self.remove(id));
            } else {
                let used = breaker.open_used.load(Ordering::Relaxed);
                if oldest.is_none_or(|(oldest, _)| used < oldest) {
                    oldest = Some((used, id));
                }
            }
            id = next;
        }
        match oldest {
            Some((_, id)) => Victim::Open(self.remove(id)),
            None => Victim::None,
        }
    }

    fn queued(&self, id: usize) -> &Arc<Breaker> {
        self.nodes[id]
            .breaker
            .as_ref()
            .expect("a queued node holds a breaker")
    }

    /// Takes a breaker an operator forced out of the queues, until a reset
    /// [`unpark`](Self::unpark)s it.
    fn park(&mut self, id: usize) {
        self.unlink(id);
        self.nodes[id].queue = Queue::Parked;
    }

    fn list(&mut self, queue: Queue) -> &mut List {
        match queue {
            Queue::Closed => &mut self.closed,
            Queue::Open => &mut self.open,
            Queue::Parked | Queue::Free => unreachable!("{queue:?} is not a list"),
        }
    }

    fn push(&mut self, id: usize, queue: Queue, joined: u64) {
        let tail = self.list(queue).tail;
        {
            let node = &mut self.nodes[id];
            node.prev = tail;
            node.next = NIL;
            node.queue = queue;
            node.joined = joined;
        }
        match tail {
            NIL => self.list(queue).head = id,
            tail => self.nodes[tail].next = id,
        }
        self.list(queue).tail = id;
    }

    /// Takes `id` out of its list (a no-op when parked).
    fn unlink(&mut self, id: usize) {
        let Node {
            prev, next, queue, ..
        } = self.nodes[id];
        if !matches!(queue, Queue::Closed | Queue::Open) {
            return;
        }
        match prev {
            NIL => self.list(queue).head = next,
            prev => self.nodes[prev].next = next,
        }
        match next {
            NIL => self.list(queue).tail = prev,
            next => self.nodes[next].prev = prev,
        }
        let node = &mut self.nodes[id];
        node.prev = NIL;
        node.next = NIL;
    }

    fn remove(&mut self, id: usize) -> Arc<Breaker> {
        self.unlink(id);
        let node = &mut self.nodes[id];
        node.queue = Queue::Free;
        let breaker = node.breaker.take().expect("a held node has a breaker");
        self.free.push(id);
        breaker
    }
}
