import ArgumentParser
import Foundation
import UploadCommandLine
import UploadProtocol
import UploadRelay
import UploadRelayLocalStore
import UploadRelayS3Store
import UploadS3

extension Serve {
    /// The relay's configuration from every option, each parsed and checked here and nowhere else: a bad value throws
    /// a ``ValidationError`` that names its option. No side effect: ``validate()`` calls it for the usage errors, and
    /// ``run()`` for the configuration. The certificate paths are `--cert` and `--key` (``run()`` puts the dev ones in).
    func relayConfiguration() throws -> RelayConfiguration {
        let (host, port) = try HostPort.parse(self.listen, option: "--listen")
        var configuration = RelayConfiguration(
            certificatePath: self.cert ?? "", privateKeyPath: self.key ?? "", dataDirectory: self.dataDirectory, storePath: self.store
        )
        configuration.host = host
        configuration.port = port
        configuration.fileModes = self.groupAccess ? .groupReadable : .private
        configuration.syncBytes = Int(try ByteCount.parse(self.syncBytes, option: "--sync-bytes"))
        configuration.allowDeflate = !self.noDeflate
        let directBuffer = try ByteCount.parse(self.directIoBuffer, option: "--direct-io-buffer")
        guard directBuffer <= LocalDirectoryStore.maxDirectBuffer else {
            throw ValidationError("--direct-io-buffer must be at most 1G")
        }
        configuration.directIOBuffer = Int(directBuffer)
        func window(_ value: String, option: String) throws -> Int {
            let bytes = try ByteCount.parse(value, option: option)
            guard bytes >= 65_536 && bytes <= Int64(Int32.max) else {
                throw ValidationError("\(option) must be between 64K and 2G-1 bytes")
            }
            return Int(bytes)
        }
        configuration.limits.streamWindow = try window(self.streamWindow, option: "--stream-window")
        configuration.limits.connectionWindow = try window(self.connectionWindow, option: "--connection-window")
        guard self.maxStreams >= 1, self.maxConnections >= 1, self.commitGroup >= 1, self.ioThreads >= 1, self.readsPerWakeup >= 1,
            self.lookupsPerConnection >= 1
        else {
            throw ValidationError(
                "--max-streams, --max-connections, --commit-group, --io-threads, --reads-per-wakeup and --lookups-per-connection must be at least 1")
        }
        configuration.readsPerWakeup = self.readsPerWakeup
        configuration.lookupsPerConnection = self.lookupsPerConnection
        configuration.limits.maxConcurrentStreams = self.maxStreams
        configuration.maxConnections = self.maxConnections
        guard self.maxStrangersPerSource >= 1, self.maxStrangers >= self.maxStrangersPerSource else {
            throw ValidationError("--max-strangers-per-source must be at least 1, and --max-strangers at least as many")
        }
        configuration.strangers = StrangerLimits(perSource: self.maxStrangersPerSource, total: self.maxStrangers)
        configuration.commitGroup = self.commitGroup
        configuration.ioThreads = self.ioThreads
        let memoryBudget = try ByteCount.parse(self.memoryBudget, option: "--memory-budget")
        guard memoryBudget >= 1 << 20 else {
            throw ValidationError("--memory-budget must be at least 1M")
        }
        configuration.memoryBudget = Int(memoryBudget)
        func positive(_ value: String, option: String) throws -> Duration {
            let duration = try DurationText.parse(value, option: option)
            guard duration > .zero else { throw ValidationError("\(option) must be more than 0") }
            return duration
        }
        configuration.limits.idleTimeout = try positive(self.idleTimeout, option: "--idle-timeout")
        configuration.limits.frameTimeout = try positive(self.frameTimeout, option: "--frame-timeout")
        configuration.limits.handshakeTimeout = try positive(self.handshakeTimeout, option: "--handshake-timeout")
        configuration.sessionExpiry = try positive(self.sessionExpiry, option: "--session-expiry")
        guard self.maxUnfinishedUploads >= 1 else { throw ValidationError("--max-unfinished-uploads must be at least 1") }
        configuration.maxUnfinishedUploads = self.maxUnfinishedUploads
        configuration.minFreeBytes = try self.minFree.map { try ByteCount.parse($0, option: "--min-free") }
        if let url = self.onCommitUrl {
            guard HookEndpoint.isValid(url) else {
                throw ValidationError("--on-commit-url \(HookEndpoint.redacted(url)): give an http:// or https:// URL")
            }
        }
        for name in self.hookEnv where name.isEmpty || name.contains("=") {
            throw ValidationError("--hook-env \(name): give the name of an environment variable, without a value")
        }
        guard self.hookConcurrency >= 1 else {
            throw ValidationError("--hook-concurrency must be at least 1")
        }
        if self.onCommit != nil || self.onCommitUrl != nil {
            var hooks = CommitHooks(command: self.onCommit, url: self.onCommitUrl)
            hooks.timeout = try DurationText.parse(self.hookTimeout, option: "--hook-timeout")
            hooks.concurrency = self.hookConcurrency
            hooks.environment = self.hookEnv
            configuration.hooks = hooks
        }
        guard self.statusMaxConnections >= 1 else {
            throw ValidationError("--status-max-connections must be at least 1")
        }
        let statusTimeout = try positive(self.statusRequestTimeout, option: "--status-request-timeout")
        if let status = self.statusListen {
            let (statusHost, statusPort) = try HostPort.parse(status, option: "--status-listen")
            var endpoint = StatusEndpoint(host: statusHost, port: statusPort)
            endpoint.maxConnections = self.statusMaxConnections
            endpoint.requestTimeout = statusTimeout
            configuration.status = endpoint
        }
        if let metrics = self.metricsListen {
            let (metricsHost, metricsPort) = try Self.metricsAddress(metrics)
            configuration.operations = .operations(host: metricsHost, port: metricsPort)
        }
        configuration.metricsPerAccount = self.metricsPerAccount
        return configuration
    }

    /// `--store s3://...` with its endpoint, region and keys; nil for the local store, where `--s3-*` are refused.
    func s3Store() throws -> S3StoreConfiguration? {
        guard let store = self.store, store.lowercased().hasPrefix("s3:") else {
            if self.s3Endpoint != nil || self.s3Region != nil {
                throw ValidationError("--s3-endpoint and --s3-region go with --store s3://BUCKET[/PREFIX]")
            }
            return nil
        }
        guard let place = S3Store.parse(store) else {
            throw ValidationError("--store \(store): an S3 store is s3://BUCKET or s3://BUCKET/PREFIX")
        }
        if let endpoint = self.s3Endpoint {
            guard let url = URL(string: endpoint), ["http", "https"].contains(url.scheme?.lowercased() ?? ""), url.host != nil else {
                throw ValidationError("--s3-endpoint \(endpoint): give an http:// or https:// URL, e.g. http://127.0.0.1:8333")
            }
            guard url.path.isEmpty || url.path == "/", url.query == nil else {
                throw ValidationError("--s3-endpoint \(endpoint): give the service's root URL, with no path (the bucket goes in --store)")
            }
        }
        guard self.s3CommitsAtOnce >= 1 else { throw ValidationError("--s3-commits-at-once must be at least 1") }
        var configuration = try self.s3Configuration(bucket: place.bucket, prefix: place.prefix)
        configuration.commitsAtOnce = self.s3CommitsAtOnce
        return configuration
    }

    /// The S3 store's settings: the bucket from --store, the endpoint and region, the keys from the environment.
    func s3Configuration(bucket: String, prefix: String) throws -> S3StoreConfiguration {
        try S3Setup.configuration(bucket: bucket, prefix: prefix, endpoint: self.s3Endpoint, region: self.s3Region)
    }

}
