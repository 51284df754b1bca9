// Command vaultdev runs a real, in-process HashiCorp Vault core in "dev"
// style (in-memory storage, single Shamir key, auto-unsealed) with only the
// Transit secrets engine available, and serves Vault's real HTTP API on a
// loopback address. It is meant for tests that need a genuine Vault Transit
// endpoint without installing a Vault binary.
//
// Usage:
//
//	vaultdev [-addr 127.0.0.1:0] [-root-token TOKEN] [-mount transit]
//
// On startup it prints exactly one line to stdout once the API is serving:
//
//	VAULT_ADDR=http://127.0.0.1:NNNNN VAULT_TOKEN=<root token> VAULT_UNSEAL_KEY=<base64>
//
// (the unseal key lets a test seal Vault, an outage Vault answers with 503,
// and unseal it again through the API).
//
// and then serves until it receives SIGINT/SIGTERM. All state is in memory.
//
// Only public Go APIs of the github.com/hashicorp/vault module are used
// (vault.NewCore, Core.Initialize/Unseal/HandleRequest, http.Handler).
package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/builtin/logical/transit"
	"github.com/hashicorp/vault/helper/namespace"
	vaulthttp "github.com/hashicorp/vault/http"
	"github.com/hashicorp/vault/internalshared/configutil"
	"github.com/hashicorp/vault/sdk/helper/consts"
	"github.com/hashicorp/vault/sdk/logical"
	"github.com/hashicorp/vault/sdk/physical/inmem"
	"github.com/hashicorp/vault/vault"
	vaultseal "github.com/hashicorp/vault/vault/seal"
)

// noBuiltins is an empty plugin registry: the only secrets engine this server
// knows is the one passed in CoreConfig.LogicalBackends, so none of Vault's
// other built-in plugins get linked into the binary.
type noBuiltins struct{}

func (noBuiltins) Contains(string, consts.PluginType) bool { return false }
func (noBuiltins) Get(string, consts.PluginType) (func() (interface{}, error), bool) {
	return nil, false
}
func (noBuiltins) Keys(consts.PluginType) []string { return nil }
func (noBuiltins) DeprecationStatus(string, consts.PluginType) (consts.DeprecationStatus, bool) {
	return consts.Unknown, false
}
func (noBuiltins) IsBuiltinEntPlugin(string, consts.PluginType) bool { return false }

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback only is intended)")
	rootToken := flag.String("root-token", os.Getenv("VAULTDEV_ROOT_TOKEN"), "root token ID to create (default: the generated one); env VAULTDEV_ROOT_TOKEN")
	mount := flag.String("mount", "transit", "path to mount the transit engine at (empty: do not mount)")
	logLevel := flag.String("log-level", "warn", "Vault log level (trace, debug, info, warn, error)")
	flag.Parse()

	if err := run(*addr, *rootToken, *mount, *logLevel); err != nil {
		fmt.Fprintln(os.Stderr, "vaultdev:", err)
		os.Exit(1)
	}
}

func run(addr, rootToken, mount, logLevel string) error {
	start := time.Now()
	logger := hclog.New(&hclog.LoggerOptions{
		Name:   "vaultdev",
		Level:  hclog.LevelFromString(logLevel),
		Output: os.Stderr,
	})

	// In-memory physical storage, as `vault server -dev` uses.
	storage, err := inmem.NewInmem(nil, logger)
	if err != nil {
		return fmt.Errorf("inmem storage: %w", err)
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	apiAddr := "http://" + ln.Addr().String()

	core, err := vault.NewCore(&vault.CoreConfig{
		Physical:        storage,
		Logger:          logger,
		DisableMlock:    true,
		BuiltinRegistry: noBuiltins{},
		LogicalBackends: map[string]logical.Factory{"transit": transit.Factory},
		RedirectAddr:    apiAddr,
	})
	if err != nil {
		return fmt.Errorf("new core: %w", err)
	}

	ctx := namespace.RootContext(context.Background())

	// Initialise with a single Shamir unseal key and unseal straight away,
	// as `vault server -dev` does.
	barrier := &vault.SealConfig{SecretShares: 1, SecretThreshold: 1, Name: "shamir"}
	if core.SealAccess().StoredKeysSupported() != vaultseal.StoredKeysNotSupported {
		barrier.StoredShares = 1
	}
	init, err := core.Initialize(ctx, &vault.InitParams{BarrierConfig: barrier})
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	if core.SealAccess().StoredKeysSupported() == vaultseal.StoredKeysSupportedGeneric {
		err = core.UnsealWithStoredKeys(ctx)
	} else {
		var ok bool
		ok, err = core.Unseal(init.SecretShares[0])
		if err == nil && !ok {
			err = errors.New("still sealed")
		}
	}
	if err != nil {
		return fmt.Errorf("unseal: %w", err)
	}
	token := init.RootToken

	// Optionally replace the generated root token with a caller-chosen one
	// (same requests `vault server -dev -dev-root-token-id` makes).
	if rootToken != "" {
		resp, err := core.HandleRequest(ctx, &logical.Request{
			Operation:   logical.UpdateOperation,
			ClientToken: token,
			Path:        "auth/token/create",
			Data: map[string]interface{}{
				"id":                rootToken,
				"policies":          []string{"root"},
				"no_parent":         true,
				"no_default_policy": true,
			},
		})
		if err := respErr(resp, err); err != nil {
			return fmt.Errorf("create root token: %w", err)
		}
		if _, err := core.HandleRequest(ctx, &logical.Request{
			Operation: logical.UpdateOperation, ClientToken: token, Path: "auth/token/revoke-self",
		}); err != nil {
			return fmt.Errorf("revoke generated root token: %w", err)
		}
		token = rootToken
	}

	// Mount transit (equivalent of `vault secrets enable transit`).
	if mount != "" {
		resp, err := core.HandleRequest(ctx, &logical.Request{
			Operation:   logical.UpdateOperation,
			ClientToken: token,
			Path:        "sys/mounts/" + mount,
			Data:        map[string]interface{}{"type": "transit"},
		})
		if err := respErr(resp, err); err != nil {
			return fmt.Errorf("mount transit: %w", err)
		}
	}

	// Vault's real HTTP API handler.
	handler := vaulthttp.Handler.Handler(&vault.HandlerProperties{
		Core:           core,
		ListenerConfig: &configutil.Listener{Address: ln.Addr().String()},
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	unsealKey := ""
	if len(init.SecretShares) > 0 {
		unsealKey = base64.StdEncoding.EncodeToString(init.SecretShares[0])
	}
	fmt.Printf("VAULT_ADDR=%s VAULT_TOKEN=%s VAULT_UNSEAL_KEY=%s\n", apiAddr, token, unsealKey)
	logger.Info("serving", "addr", apiAddr, "startup", time.Since(start))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	return core.Shutdown()
}

// respErr folds a logical response error into a Go error.
func respErr(resp *logical.Response, err error) error {
	if err != nil {
		return err
	}
	if resp != nil && resp.IsError() {
		return resp.Error()
	}
	return nil
}
