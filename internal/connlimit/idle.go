package connlimit

import (
	"context"
	"net"
	"sync/atomic"

	"google.golang.org/grpc/stats"
)

// connKey names an accepted connection by its two ends, as the gRPC
// server reports them to a stats handler.
func connKey(local, remote net.Addr) string {
	if local == nil || remote == nil {
		return ""
	}
	return local.String() + " " + remote.String()
}

// expire runs when c's idle timer fires: it closes c if it has been idle
// for MaxIdle, or re-arms the timer for the rest. It runs the check in its
// own goroutine, since a fake clock calls it with its own lock held.
func (c *trackedConn) expire() {
	go func() {
		l := c.l
		l.mu.Lock()
		if c.removed {
			l.mu.Unlock()
			return
		}
		c.timer = nil
		if c.inFlight > 0 {
			// Re-armed when the last request ends.
			l.mu.Unlock()
			return
		}
		if rest := l.limits.MaxIdle - l.clock.Since(c.idleSince); rest > 0 {
			c.timer = l.clock.AfterFunc(rest, c.expire)
			l.mu.Unlock()
			return
		}
		l.removeLocked(c)
		l.mu.Unlock()
		l.closed.WithLabelValues(ReasonIdle).Inc()
		if l.onClose != nil {
			l.onClose(c.source, ReasonIdle)
		}
		_ = c.Conn.Close()
	}()
}

// oldestIdleLocked returns the connection accepted first among those
// without a request in flight, or nil; l.mu is held. Age rather than
// idle time decides: a peer can make its connections look freshly idle
// with a cheap request, but cannot make them younger than a new one
// without the handshake budget that a new connection costs.
func (l *Listener) oldestIdleLocked() *trackedConn {
	var oldest *trackedConn
	for _, c := range l.conns {
		if c.inFlight == 0 && (oldest == nil || c.accepted.Before(oldest.accepted)) {
			oldest = c
		}
	}
	return oldest
}

// begin marks a request in flight on c.
func (c *trackedConn) begin() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	c.inFlight++
}

// end marks the end of a request on c; the last one starts its idle time.
func (c *trackedConn) end() {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.inFlight--; c.inFlight > 0 || c.removed {
		return
	}
	c.idleSince = l.clock.Now()
	if l.limits.MaxIdle > 0 && c.timer == nil {
		c.timer = l.clock.AfterFunc(l.limits.MaxIdle, c.expire)
	}
}

// lookup returns the open connection with these ends, or nil.
func (l *Listener) lookup(local, remote net.Addr) *trackedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[connKey(local, remote)]
}

// StatsHandler returns a gRPC stats handler telling l which of its
// connections have requests in flight (grpc.StatsHandler on the server
// serving l). A request is in flight from the moment its first message
// has arrived in full until its response ends: a stream whose request
// never arrives leaves its connection idle (Limits.MaxIdle) and evictable
// (Limits.EvictIdle).
func (l *Listener) StatsHandler() stats.Handler { return statsHandler{l: l} }

type statsHandler struct{ l *Listener }

type connCtxKey struct{}

type rpcCtxKey struct{}

// rpcMark records whether an RPC was counted in flight.
type rpcMark struct{ counted atomic.Bool }

func (h statsHandler) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if c := h.l.lookup(info.LocalAddr, info.RemoteAddr); c != nil {
		return context.WithValue(ctx, connCtxKey{}, c)
	}
	return ctx
}

// HandleConn does nothing: a connection's idle time starts at accept,
// not at the end of its handshake, which the server learns of only after
// the client may have sent its first request (a race no fake clock could
// order).
func (h statsHandler) HandleConn(context.Context, stats.ConnStats) {}

func (h statsHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, rpcCtxKey{}, &rpcMark{})
}

func (h statsHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	c, ok := ctx.Value(connCtxKey{}).(*trackedConn)
	mark, marked := ctx.Value(rpcCtxKey{}).(*rpcMark)
	if !ok || !marked {
		return
	}
	switch s.(type) {
	case *stats.InPayload:
		if mark.counted.CompareAndSwap(false, true) {
			c.begin()
		}
	case *stats.End:
		if mark.counted.Load() {
			c.end()
		}
	}
}
