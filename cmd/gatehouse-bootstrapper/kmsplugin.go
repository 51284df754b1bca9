package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os/signal"
	"syscall"
	"time"

	"github.com/gatehouse-dev/gatehouse/bootstrapper"
	"github.com/gatehouse-dev/gatehouse/internal/kmsplugin"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// serveKMS serves the control plane's KMS v2 plugin (docs/keys.md,
// "Secrets encrypted in etcd") from the KEKs init or join wrote, waiting
// for them on a node that has not initialised or joined yet (or never
// becomes a control plane). It depends on nothing but the node's own
// state disk, so an API server restarting from cold finds it.
func serveKMS(log *slog.Logger, args []string) error {
	flags := flag.NewFlagSet("serve-kms", flag.ExitOnError)
	keksFile := flags.String("keys", bootstrapper.EtcdKEKFile, "the control plane's KMS v2 key-encryption keys (written by init or join)")
	socket := flags.String("socket", kubeadm.KMSPluginSocket, "the Unix socket the API server's EncryptionConfiguration names")
	if err := flags.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	waiting := false
	for {
		keks, err := kmsplugin.ReadKEKs(*keksFile)
		switch {
		case err == nil:
			oldest, current := keks.Generations()
			plugin, err := kmsplugin.New(keks, current, oldest, log)
			if err != nil {
				return err
			}
			log.Info("Serving the KMS v2 plugin", slog.String("socket", *socket), slog.String("keyID", kmsplugin.KeyID(current)))
			return kmsplugin.Serve(ctx, *socket, plugin)
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("reading the KMS v2 key-encryption keys: %w", err)
		case !waiting:
			log.Info("Waiting for init or join to write the KMS v2 key-encryption keys", slog.String("file", *keksFile))
			waiting = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}
