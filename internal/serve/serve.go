// Package serve runs a Gatehouse service's two servers, gRPC for its API and
// HTTP for metrics and health, for as long as the service lives.
package serve

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
)

// shutdownTimeout bounds how long the HTTP server's open requests may take
// once the service stops.
const shutdownTimeout = 5 * time.Second

// Run serves grpcServer on lis and httpServer on its Addr until ctx ends
// (the service's SIGTERM) or either server fails, then stops both: gRPC
// gracefully (in-flight RPCs finish, new ones are refused), HTTP within
// shutdownTimeout. It returns nil after a stop by ctx, else the server's
// error (e.g. the HTTP address is taken). name is the service's name in the
// log lines; attrs are logged with the start line.
func Run(ctx context.Context, log *slog.Logger, name string, grpcServer *grpc.Server, lis net.Listener, httpServer *http.Server, attrs ...any) error {
	httpLis, err := net.Listen("tcp", httpServer.Addr)
	if err != nil {
		_ = lis.Close()
		return err
	}
	errs := make(chan error, 2)
	go func() { errs <- grpcServer.Serve(lis) }()
	go func() { errs <- httpServer.Serve(httpLis) }()
	log.Info(name+" started", append([]any{"listen", lis.Addr().String(), "httpListen", httpLis.Addr().String()}, attrs...)...)
	select {
	case <-ctx.Done():
		log.Info(name + " stopping")
	case err = <-errs:
	}
	grpcServer.GracefulStop()
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	_ = httpServer.Shutdown(shutdownCtx)
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
