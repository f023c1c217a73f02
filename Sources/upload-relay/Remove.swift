import ArgumentParser
import Foundation
import Logging
import UploadCommandLine
import UploadRelay
import UploadRelayBackends
import UploadRelayPostgres
import UploadRelayS3Store
import UploadS3

/// Where the objects are, for the commands that remove them: the same `--store` (and S3 options) as `serve`.
struct StoreOptions: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp(
            "Where serve commits objects: a directory (default: <data>/store) or s3://BUCKET[/PREFIX], as given to serve.", valueName: "dir|s3-url")
    )
    var store: String?

    @Option(name: .long, help: ArgumentHelp("With an s3:// store: the S3 service's URL, as given to serve.", valueName: "url"))
    var s3Endpoint: String?

    @Option(
        name: .long,
        help: ArgumentHelp("With an s3:// store: the region requests are signed for (default: AWS_REGION, else us-east-1).", valueName: "region"))
    var s3Region: String?

    func openStore(data: String, catalog: any Catalog, logger: Logger) throws -> any BlobStore {
        let configuration = RelayConfiguration(certificatePath: "", privateKeyPath: "", dataDirectory: data, storePath: self.store)
        var s3: S3StoreConfiguration? = nil
        if let store = self.store, let (bucket, prefix) = S3Store.parse(store) {
            s3 = try S3Setup.configuration(bucket: bucket, prefix: prefix, endpoint: self.s3Endpoint, region: self.s3Region)
        }
        return try RelayRuntime.openStore(configuration, s3: s3, catalog: catalog, logger: logger)
    }
}

/// The S3 store's settings from the options and the environment (serve's and the admin commands').
enum S3Setup {
    static func configuration(bucket: String, prefix: String, endpoint: String?, region: String?) throws -> S3StoreConfiguration {
        let environment = ProcessInfo.processInfo.environment
        let region = region ?? environment["AWS_REGION"] ?? environment["AWS_DEFAULT_REGION"] ?? "us-east-1"
        let address = endpoint ?? "https://s3.\(region).amazonaws.com"
        guard let url = URL(string: address) else { throw ValidationError("--s3-endpoint \(address) is not a URL") }
        let credentials: S3Credentials?
        do {
            credentials = try S3Credentials.load(environment: environment)
        } catch {
            throw ValidationError("S3 credentials: \(error)")
        }
        guard let credentials else {
            throw ValidationError(
                "no S3 credentials for --store s3://\(bucket): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials (AWS_PROFILE)"
            )
        }
        return S3StoreConfiguration(endpoint: S3Endpoint(url: url, region: region), credentials: credentials, bucket: bucket, prefix: prefix)
    }
}

/// `upload-relay rm --account A KEY...`: objects out of the store and the catalog together.
struct Remove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm",
        abstract: "Remove stored objects of an account: the object in the store and its catalog row together.",
        discussion: """
            Only objects the catalog records are removed, and only when what is at their place is still what the \
            relay committed (a file changed by hand is left as it is, and said so). A key with an upload under way \
            is left too. Works on the SQLite and the PostgreSQL catalog, the local and the S3 store: pass the \
            --store (and --s3-endpoint) that serve uses. Each key gets one line: removed, not stored, or left with \
            why. Exit status: 0 when every key was removed, 1 when some were not, 2 for a usage error.
            """
    )

    @Option(name: .long, help: ArgumentHelp("The account whose objects these are.", valueName: "name"))
    var account: String

    @Argument(help: ArgumentHelp("Keys to remove, as ls shows them.", valueName: "key"))
    var keys: [String]

    @Flag(name: .long, help: "One JSON object per key: {\"key\", \"status\": \"removed\"|\"not_stored\"|\"refused\", \"bytes\", \"error\"}.")
    var json = false

    @OptionGroup var options: Token.Options
    @OptionGroup var storeOptions: StoreOptions

    func validate() throws {
        guard !self.keys.isEmpty else { throw ValidationError("name at least one key (upload-relay ls --account \(self.account) lists them)") }
    }

    func run() async throws {
        let catalog = try await self.options.openCatalog()
        defer { (catalog as? PostgresCatalog)?.shutdown() }
        guard try await catalog.account(named: self.account) != nil else {
            throw ValidationError(CatalogError.unknownAccount(self.account).description)
        }
        let logger = Logger(label: "upload-relay")
        let store = try self.storeOptions.openStore(data: self.options.dataDirectory, catalog: catalog, logger: logger)
        var failed = false
        for key in self.keys {
            let outcome: RelayAdmin.Removal
            do {
                outcome = try await RelayAdmin.remove(key: key, account: self.account, catalog: catalog, store: store, logger: logger)
            } catch {
                outcome = .refused("\(error)")
            }
            switch outcome {
            case .removed(let size):
                self.say(key, "removed", size, nil, text: "removed     \(key)  \(Format.bytes(size))")
            case .notStored:
                failed = true
                self.say(key, "not_stored", nil, "no object \"\(key)\" for account \"\(self.account)\"", text: "not stored  \(key)")
            case .refused(let reason):
                failed = true
                self.say(key, "refused", nil, reason, text: "left        \(key): \(reason)")
            }
        }
        if failed { throw ExitCode(1) }
    }

    private func say(_ key: String, _ status: String, _ bytes: Int64?, _ error: String?, text: String) {
        guard self.json else {
            print(text)
            return
        }
        var object: [String: Any] = ["key": key, "status": status]
        if let bytes { object["bytes"] = bytes }
        if let error { object["error"] = error }
        if let line = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]) {
            print(String(decoding: line, as: UTF8.self))
        }
    }
}
