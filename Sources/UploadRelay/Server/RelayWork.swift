import Logging
import NIOCore
import UploadChecksums
import UploadProtocol

/// A connection's blocking work, run on the I/O thread pool, each answer delivered on the connection's event loop:
/// the catalog lookup of a credential, and the lookup of an OPEN (with, for an upload, the executor of its storage).
package struct RelayWork {
    let services: RelayServices
    let eventLoop: any EventLoop

    /// The account the HELLO's token names, if any.
    func authenticate(_ hello: Frame.Hello, then answer: @escaping (Result<Account?, any Error>) -> Void) {
        let (catalog, hash) = (self.services.catalog, Tokens.hash(hello.credential))
        self.services.threadPool.runIfActive(eventLoop: self.eventLoop) {
            try catalog.account(tokenHash: hash)
        }.assumeIsolated().whenComplete(answer)
    }

    /// The relay's answer to OPEN by ``UploadPolicy``; for an upload, the executor that will run its storage steps
    /// (it holds the staging file and the SHA-1 state, which the session never sees).
    func lookUp(
        _ open: Frame.Open, _ key: ObjectKey, _ account: Account, logger: Logger,
        then answer: @escaping (RelaySession.LookUp, UploadExecutor?) -> Void
    ) {
        let (services, eventLoop) = (self.services, self.eventLoop)
        services.threadPool.runIfActive(eventLoop: eventLoop) {
            Self.lookUp(open, key, account, services: services, logger: logger)
        }.assumeIsolated().whenComplete { result in
            switch result {
            case .success(let (decision, storage)):
                answer(decision, storage.map { UploadExecutor(storage: $0, pool: services.threadPool, eventLoop: eventLoop) })
            case .failure(let error):
                // The I/O pool stopped: the relay is going away.
                logger.debug("open not looked up", metadata: ["error": "\(error)"])
                answer(.refuse(.internalError, "the relay is stopping; retry later"), nil)
            }
        }
    }

    /// The relay's answer to PLAN (SPEC §7.2), read from the catalog off the event loop.
    func plan(_ plan: Frame.Plan, _ account: Account, then answer: @escaping (Result<Frame.Room, UploadPolicy.Refusal>) -> Void) {
        let services = self.services
        services.threadPool.runIfActive(eventLoop: self.eventLoop) {
            UploadPolicy(services: services).plan(account: account, plan: plan)
        }.assumeIsolated().whenComplete { result in
            switch result {
            case .success(let room):
                answer(room)
            case .failure:
                answer(.failure(UploadPolicy.Refusal(code: .internalError, message: "the relay is stopping; retry later", keepSession: true)))
            }
        }
    }

    /// The lookup itself, blocking: the session's answer and, for an upload, its storage.
    package static func lookUp(
        _ open: Frame.Open, _ key: ObjectKey, _ account: Account, services: RelayServices, logger: Logger
    ) -> (RelaySession.LookUp, UploadStorage?) {
        switch UploadPolicy(services: services).open(account: account, open: open, key: key) {
        case .stored(let size):
            return (.stored(size: size), nil)
        case .confirm:
            return (.confirm, nil)
        case .refuse(let code, let message):
            return (.refuse(code, message), nil)
        case .upload(let session, let staging, let sha1, let recorded, let resumed, let byteLimit):
            let storage = UploadStorage(
                key: key, account: account.name, overwrite: open.overwrite, session: session, recorded: recorded, staging: staging,
                sha1: sha1, services: services, logger: logger
            )
            let decision = RelaySession.LookUp.upload(
                durableOffset: session.durableOffset, resumeToken: session.resumeToken, resumed: resumed, byteLimit: byteLimit
            )
            return (decision, storage)
        case .stripe(let session, let staging, let index):
            let storage = UploadStorage(
                key: key, account: account.name, overwrite: false, session: session, recorded: true, staging: staging, sha1: SHA1(),
                services: services, logger: logger, stripe: index
            )
            return (.stripe, storage)
        }
    }
}
